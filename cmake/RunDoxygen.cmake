# cmake -DDOXYGEN=... -DDOXYFILE=... -DOUT_DIR=... -P RunDoxygen.cmake: runs
# Doxygen and fails when it fails or warns (also where a Doxygen older than
# 1.9 would not honour WARN_AS_ERROR = FAIL_ON_WARNINGS), printing each warning.
file(REMOVE_RECURSE "${OUT_DIR}")
file(MAKE_DIRECTORY "${OUT_DIR}")
execute_process(COMMAND "${DOXYGEN}" "${DOXYFILE}" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(err)
  message("${err}")
endif()
string(REGEX MATCHALL "(warning|error): [^\n]*" warnings "${err}")
list(LENGTH warnings count)
if(NOT rc EQUAL 0 OR count GREATER 0)
  message(FATAL_ERROR "doc: doxygen reported ${count} warning(s) (exit status ${rc}); "
                      "every public declaration needs a /// comment")
endif()
message("doc: the API reference, without warnings: ${OUT_DIR}/html/index.html")
