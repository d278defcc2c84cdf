# The package test (cmake -P): installs the build tree into a prefix, then
# builds tests/package against it three times: with find_package, with
# find_package where CUDA cannot be found (a program that does not use CUDA
# must not need it), and with pkg-config; and runs the programs. In a build
# with CUDA, the `cuda` component's program too (find_package and
# pkg-config). Inputs: BUILD_DIR, SOURCE_DIR, WORK_DIR, LIBDIR (lib, as
# installed), CXX (the compiler), CXX_FLAGS and LINK_FLAGS (the build's, e.g.
# sanitizers), HAVE_CUDA (whether the build has the CUDA runtime layer).
cmake_minimum_required(VERSION 3.25)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "package test: '${cmd}' failed (${rc})")
  endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")

foreach(f IN ITEMS ${LIBDIR}/libmultidev.a include/multidev/multidev.hpp bin/multidev
                   ${LIBDIR}/cmake/multidev/MultidevScenarioTest.cmake
                   ${LIBDIR}/cmake/multidev/multidevConfig.cmake
                   ${LIBDIR}/cmake/multidev/multidevConfigVersion.cmake
                   ${LIBDIR}/cmake/multidev/multidevTargets.cmake
                   ${LIBDIR}/cmake/multidev/FindCAF.cmake ${LIBDIR}/pkgconfig/multidev.pc)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "package test: the install lacks ${f}")
  endif()
endforeach()
file(GLOB_RECURSE private_headers RELATIVE "${prefix}" "${prefix}/include/actors/*"
     "${prefix}/include/messages/*" "${prefix}/include/devices/*")
if(private_headers)
  message(FATAL_ERROR "package test: internal headers installed: ${private_headers}")
endif()

# find_package, from a directory outside the source tree.
run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build"
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX}"
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}")
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
execute_process(COMMAND "${WORK_DIR}/build/package_user" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out)
message("find_package: ${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "package test: the find_package program failed (${rc})")
endif()

# The cuda component: built and run where the build has it.
if(HAVE_CUDA)
  if(NOT EXISTS "${WORK_DIR}/build/package_cuda_user")
    message(FATAL_ERROR "package test: the build has CUDA, but find_package(multidev "
                        "OPTIONAL_COMPONENTS cuda) gave no multidev::cuda")
  endif()
  execute_process(COMMAND "${WORK_DIR}/build/package_cuda_user" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out)
  message("find_package cuda: ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: the multidev::cuda program failed (${rc})")
  endif()
endif()

# find_package where CUDA cannot be found, as on a machine without the CUDA
# Toolkit: no nvcc on PATH, no CUDACXX or CUDA_PATH, no CUDAToolkit_ROOT
# that exists, and find_package(CUDAToolkit) disabled. multidev::multidev
# must configure, build and run; the optional cuda component is just absent.
set(path_without_cuda "")
string(REPLACE ":" ";" path_dirs "$ENV{PATH}")
foreach(dir IN LISTS path_dirs)
  if(NOT EXISTS "${dir}/nvcc" AND NOT dir MATCHES "cuda")
    list(APPEND path_without_cuda "${dir}")
  endif()
endforeach()
string(REPLACE ";" ":" path_without_cuda "${path_without_cuda}")
execute_process(COMMAND "${CMAKE_COMMAND}" -E env "PATH=${path_without_cuda}" --unset=CUDACXX
                        --unset=CUDA_PATH --unset=CUDA_HOME --unset=CUDAToolkit_ROOT
                        "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build-no-cuda"
                        "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX}"
                        "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}"
                        -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
                        -DCUDAToolkit_ROOT=/nonexistent
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "package test: find_package(multidev) failed where CUDA cannot be "
                      "found (${rc}):\n${out}")
endif()
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build-no-cuda")
if(EXISTS "${WORK_DIR}/build-no-cuda/package_cuda_user")
  message(FATAL_ERROR "package test: multidev::cuda was found where CUDA cannot be")
endif()
execute_process(COMMAND "${WORK_DIR}/build-no-cuda/package_user" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out)
message("without CUDA: ${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "package test: the program built without CUDA failed (${rc})")
endif()

# multidev_add_scenario_test: the passing scenario passes, the one whose
# expectation fails fails.
execute_process(COMMAND "${CMAKE_CTEST_COMMAND}" --test-dir "${WORK_DIR}/build" -R "^package_scenario$"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "package test: the scenario test failed (${rc}):\n${out}")
endif()
execute_process(COMMAND "${CMAKE_CTEST_COMMAND}" --test-dir "${WORK_DIR}/build" -R "^package_scenario_fails$"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "package test: a scenario whose expectation fails passed as a test:\n${out}")
endif()
message("scenario tests: package_scenario passed, package_scenario_fails failed as it must")

# pkg-config.
set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
execute_process(COMMAND pkg-config --cflags --libs multidev RESULT_VARIABLE rc
                OUTPUT_VARIABLE pc_flags OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "package test: pkg-config --cflags --libs multidev failed (${rc})")
endif()
message("pkg-config --cflags --libs multidev: ${pc_flags}")
if(pc_flags MATCHES "[Cc][Uu][Dd][Aa]")
  message(FATAL_ERROR "package test: multidev.pc names CUDA: ${pc_flags}")
endif()
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
separate_arguments(extra UNIX_COMMAND "${CXX_FLAGS} ${LINK_FLAGS}")
run("${CXX}" -std=c++20 ${extra} "${SOURCE_DIR}/main.cpp" -o "${WORK_DIR}/pc_user" ${pc_flags})
execute_process(COMMAND "${WORK_DIR}/pc_user" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message("pkg-config: ${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "package test: the pkg-config program failed (${rc})")
endif()

if(HAVE_CUDA)
  execute_process(COMMAND pkg-config --cflags --libs multidev-cuda RESULT_VARIABLE rc
                  OUTPUT_VARIABLE pc_cuda_flags OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: pkg-config --cflags --libs multidev-cuda failed (${rc})")
  endif()
  separate_arguments(pc_cuda_flags UNIX_COMMAND "${pc_cuda_flags}")
  run("${CXX}" -std=c++20 ${extra} "${SOURCE_DIR}/cuda_user.cpp" -o "${WORK_DIR}/pc_cuda_user"
      ${pc_cuda_flags})
  execute_process(COMMAND "${WORK_DIR}/pc_cuda_user" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message("pkg-config cuda: ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: the multidev-cuda program failed (${rc})")
  endif()
endif()

# Passed: its scratch goes (a prefix and four programs with the library's
# debug info: over 1 GB in a sanitizer build, which a CI machine's disk
# may not have to spare). A failure above leaves it for a look.
file(REMOVE_RECURSE "${WORK_DIR}")
