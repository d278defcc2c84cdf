# multidev_add_scenario_test(NAME FILE [ARGS...])
#
# Registers a CTest test NAME that runs `multidev run FILE ARGS...`: it
# passes when every expectation of the scenario holds (exit status 0) and
# fails when one does not (1) or the script is wrong (2). A relative FILE is
# taken from the calling directory. The test is labelled `scenario` and
# times out after 300 s (set_tests_properties can change both).
#
# Installed with the package (find_package(multidev) provides it, running
# the installed tool multidev::multidev_tool); multidev's own build uses it
# for its examples.
function(multidev_add_scenario_test name file)
  if(NOT TARGET multidev::multidev_tool)
    message(FATAL_ERROR "multidev_add_scenario_test: the multidev tool (target "
                        "multidev::multidev_tool) is not known here")
  endif()
  cmake_path(ABSOLUTE_PATH file BASE_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}"
             OUTPUT_VARIABLE script)
  add_test(NAME ${name} COMMAND multidev::multidev_tool run "${script}" ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS scenario)
endfunction()
