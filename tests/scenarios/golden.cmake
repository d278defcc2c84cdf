# Golden logical trace (cmake -P): runs TOOL on SCRIPT with --logical-trace
# (and ARGS, a ;-list), then compares the file with GOLDEN byte for byte.
# Set UPDATE=1 to rewrite the golden file instead.
cmake_minimum_required(VERSION 3.25)
get_filename_component(name "${GOLDEN}" NAME_WE)
set(out "${WORK_DIR}/${name}.logical")
file(MAKE_DIRECTORY "${WORK_DIR}")
execute_process(COMMAND "${TOOL}" run "${SCRIPT}" --logical-trace "${out}" ${ARGS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "golden: multidev run ${SCRIPT} exited with ${rc}:\n${stdout}${stderr}")
endif()
if(UPDATE)
  file(COPY_FILE "${out}" "${GOLDEN}")
  message("golden: wrote ${GOLDEN}")
  return()
endif()
file(READ "${out}" got)
file(READ "${GOLDEN}" want)
if(NOT got STREQUAL want)
  execute_process(COMMAND diff -u "${GOLDEN}" "${out}" OUTPUT_VARIABLE diff)
  message(FATAL_ERROR "golden: the logical trace of ${SCRIPT} differs from ${GOLDEN}:\n${diff}")
endif()
message("golden: ${name} matches")
