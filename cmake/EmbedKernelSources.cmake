# Embeds kernel_src/ files as raw string data into a generated C++ file in the build tree.
# Each file becomes {name, bytes}; the runtime hands them to NVRTC as in-memory headers.
function(astrai_embed_kernel_sources)
  cmake_parse_arguments(ARG "" "OUTPUT" "SOURCES" ${ARGN})
  set(abs_sources "")
  foreach(src IN LISTS ARG_SOURCES)
    list(APPEND abs_sources ${CMAKE_CURRENT_SOURCE_DIR}/${src})
  endforeach()
  add_custom_command(
    OUTPUT ${ARG_OUTPUT}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${ARG_OUTPUT} "-DSOURCES=${abs_sources}"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/GenerateEmbeddedSources.cmake
    DEPENDS ${abs_sources} ${CMAKE_CURRENT_SOURCE_DIR}/cmake/GenerateEmbeddedSources.cmake
    COMMENT "Embedding kernel templates"
    VERBATIM)
endfunction()
