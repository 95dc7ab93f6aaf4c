# Embeds files as exact bytes into a generated C++ file in the build tree
# (cmake/GenerateEmbeddedSources.cmake): FUNCTION in NAMESPACE returns them as {name, bytes}
# ELEMENTs, declared by HEADER. The benchmarks embed their own kernels this way; the library's
# kernel templates (handed to NVRTC as in-memory headers) go through astrai_embed_kernel_sources.
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

# The library's kernel templates (paths relative to the calling directory), written by the
# GENERATOR executable target (tools/embed/embed_kernel_sources.cpp): besides the bytes, each file's
# source_digest and include closure, computed here so that a cached load in a fresh process
# neither scans nor hashes the sources.
function(astrai_embed_kernel_sources)
  cmake_parse_arguments(ARG "" "OUTPUT;GENERATOR" "SOURCES" ${ARGN})
  set(abs_sources "")
  foreach(src IN LISTS ARG_SOURCES)
    list(APPEND abs_sources ${CMAKE_CURRENT_SOURCE_DIR}/${src})
  endforeach()
  add_custom_command(
    OUTPUT ${ARG_OUTPUT}
    COMMAND ${ARG_GENERATOR} ${ARG_OUTPUT} ${abs_sources}
    DEPENDS ${abs_sources} ${ARG_GENERATOR}
    COMMENT "Embedding kernel templates with their digests and include closures"
    VERBATIM)
endfunction()
