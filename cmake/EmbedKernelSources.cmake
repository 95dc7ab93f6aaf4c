# Embeds files as exact bytes into a generated C++ file in the build tree
# (cmake/GenerateEmbeddedSources.cmake): FUNCTION in NAMESPACE returns them as {name, bytes}
# ELEMENTs, declared by HEADER. The runtime hands its kernel templates to NVRTC as in-memory
# headers; the benchmarks embed their own kernels the same way.
function(astrai_embed_files)
  cmake_parse_arguments(ARG "" "OUTPUT;HEADER;NAMESPACE;FUNCTION;ELEMENT;COMMENT" "SOURCES" ${ARGN})
  set(generator ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/GenerateEmbeddedSources.cmake)
  add_custom_command(
    OUTPUT ${ARG_OUTPUT}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${ARG_OUTPUT} "-DSOURCES=${ARG_SOURCES}" "-DHEADER=${ARG_HEADER}"
            -DNAMESPACE=${ARG_NAMESPACE} -DFUNCTION=${ARG_FUNCTION} "-DELEMENT=${ARG_ELEMENT}" -P ${generator}
    DEPENDS ${ARG_SOURCES} ${generator}
    COMMENT "${ARG_COMMENT}"
    VERBATIM)
endfunction()

# The library's kernel templates (paths relative to the calling directory).
function(astrai_embed_kernel_sources)
  cmake_parse_arguments(ARG "" "OUTPUT" "SOURCES" ${ARGN})
  set(abs_sources "")
  foreach(src IN LISTS ARG_SOURCES)
    list(APPEND abs_sources ${CMAKE_CURRENT_SOURCE_DIR}/${src})
  endforeach()
  astrai_embed_files(OUTPUT ${ARG_OUTPUT} SOURCES ${abs_sources} HEADER "\"runtime/kernel_sources.hpp\""
                     NAMESPACE astrai::detail FUNCTION embedded_kernel_sources ELEMENT EmbeddedSource
                     COMMENT "Embedding kernel templates")
endfunction()
