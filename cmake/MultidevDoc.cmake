# The API reference (issue 39 point 2): the target `doc` runs Doxygen (Debian
# `doxygen`) over the public headers with docs/Doxyfile.in, into
# build/doc/html/, and fails on any warning (cmake/RunDoxygen.cmake). Without
# doxygen the target says so and fails; the `docs` test is then skipped.
find_program(MULTIDEV_DOXYGEN doxygen)
set(MULTIDEV_DOC_DIR "${PROJECT_BINARY_DIR}/doc")
configure_file("${PROJECT_SOURCE_DIR}/docs/Doxyfile.in" "${PROJECT_BINARY_DIR}/Doxyfile" @ONLY)
if(MULTIDEV_DOXYGEN)
  add_custom_target(doc
    COMMAND "${CMAKE_COMMAND}" "-DDOXYGEN=${MULTIDEV_DOXYGEN}"
            "-DDOXYFILE=${PROJECT_BINARY_DIR}/Doxyfile" "-DOUT_DIR=${MULTIDEV_DOC_DIR}"
            -P "${PROJECT_SOURCE_DIR}/cmake/RunDoxygen.cmake"
    COMMENT "API reference: Doxygen over include/multidev/ into ${MULTIDEV_DOC_DIR}/html"
    VERBATIM)
else()
  add_custom_target(doc
    COMMAND "${CMAKE_COMMAND}" -E echo "doc: doxygen is not installed (Debian: doxygen)"
    COMMAND "${CMAKE_COMMAND}" -E false
    VERBATIM)
endif()
