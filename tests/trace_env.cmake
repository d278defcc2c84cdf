# MULTIDEV_TRACE (docs/api.md, "Traces"): examples/first, a program that
# knows nothing of traces, writes its Chrome trace when its backend is
# destroyed; the JSON has the produce and consume slices, each on its
# device's track. An unwritable path changes nothing but a line on stderr;
# a name ending in .svg gets the SVG timeline.
#
#   cmake -DEXAMPLE=build/bin/example_first -DWORK_DIR=/tmp/x -P tests/trace_env.cmake
cmake_minimum_required(VERSION 3.25)

function(fail what)
  message(FATAL_ERROR "trace test: ${what}")
endfunction()

# Runs the example with MULTIDEV_TRACE=`trace`; it must succeed as always.
function(run_example trace out_err)
  execute_process(COMMAND "${CMAKE_COMMAND}" -E env "MULTIDEV_TRACE=${trace}" "${EXAMPLE}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "consumed 42")
    fail("MULTIDEV_TRACE=${trace} ${EXAMPLE}: status ${rc}, output '${out}', stderr '${err}'")
  endif()
  set(${out_err} "${err}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(trace "${WORK_DIR}/first.json")
run_example("${trace}" err)
if(NOT EXISTS "${trace}")
  fail("MULTIDEV_TRACE=${trace}: no file was written")
endif()
file(READ "${trace}" json)
string(JSON events ERROR_VARIABLE bad GET "${json}" traceEvents)
if(bad)
  fail("${trace} is not a Chrome trace: ${bad}")
endif()
string(JSON count LENGTH "${events}")
# Track names by tid, and the tid of each slice of interest.
foreach(i RANGE 0 ${count})
  if(i EQUAL count)
    break()
  endif()
  string(JSON ph GET "${events}" ${i} ph)
  string(JSON name GET "${events}" ${i} name)
  if(ph STREQUAL "M" AND name STREQUAL "thread_name")
    string(JSON tid GET "${events}" ${i} tid)
    string(JSON track_${tid} GET "${events}" ${i} args name)
  elseif(ph STREQUAL "X" AND (name STREQUAL "produce" OR name STREQUAL "consume"))
    if(DEFINED ${name}_tid)
      fail("two '${name}' slices in ${trace}")
    endif()
    string(JSON ${name}_tid GET "${events}" ${i} tid)
  endif()
endforeach()
foreach(name IN ITEMS produce consume)
  if(NOT DEFINED ${name}_tid)
    fail("no '${name}' slice in ${trace}")
  endif()
endforeach()
if(NOT track_${produce_tid} MATCHES "^device 0 \\(multidev_cpu:0:"
   OR NOT track_${consume_tid} MATCHES "^device 1 \\(multidev_cpu:1:")
  fail("produce on track '${track_${produce_tid}}', consume on '${track_${consume_tid}}': "
       "expected device 0 and device 1")
endif()

# An unwritable path: the program runs as before and says why on stderr.
set(bad_path "${WORK_DIR}/no-such-dir/first.json")
run_example("${bad_path}" err)
if(NOT err MATCHES "multidev: MULTIDEV_TRACE: cannot write '${bad_path}': No such file or directory")
  fail("MULTIDEV_TRACE=${bad_path}: stderr '${err}' does not say the path cannot be written")
endif()

# A name ending in .svg: the timeline.
set(svg "${WORK_DIR}/first.svg")
run_example("${svg}" err)
file(READ "${svg}" text LIMIT 200)
if(NOT text MATCHES "^<svg xmlns=")
  fail("MULTIDEV_TRACE=${svg}: not an SVG: '${text}'")
endif()

message(STATUS "trace test: passed: produce on '${track_${produce_tid}}', consume on "
               "'${track_${consume_tid}}'")
