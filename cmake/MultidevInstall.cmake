# `cmake --install build --prefix P`: the static library, the public headers
# (include/ only), the command-line tool, a CMake package (namespace
# multidev::, finding CAF through the FindCAF.cmake installed beside it) and
# a pkg-config file; in a build with CUDA, also the CUDA runtime layer
# (libmultidev_cuda.a: the package's `cuda` component, and multidev-cuda.pc).
include(CMakePackageConfigHelpers)

set(MULTIDEV_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/multidev")

install(TARGETS multidev EXPORT multidevTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
install(TARGETS multidev_tool EXPORT multidevTargets RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.hpp")
install(EXPORT multidevTargets NAMESPACE multidev:: DESTINATION "${MULTIDEV_CMAKE_DIR}")
# The CUDA runtime layer (multidev::cuda, the `cuda` component) in an export
# set of its own: the only file that names CUDA::cudart_static, read only when
# a consumer asks for the component, so multidevTargets.cmake needs no CUDA.
if(TARGET multidev_cuda)
  install(TARGETS multidev_cuda EXPORT multidevCudaTargets
          ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
  install(EXPORT multidevCudaTargets NAMESPACE multidev:: DESTINATION "${MULTIDEV_CMAKE_DIR}")
endif()

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/multidevConfig.cmake.in"
                              "${PROJECT_BINARY_DIR}/multidevConfig.cmake"
                              INSTALL_DESTINATION "${MULTIDEV_CMAKE_DIR}")
# 0.x: a minor version may break the interface.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/multidevConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/multidevConfig.cmake"
              "${PROJECT_BINARY_DIR}/multidevConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/MultidevScenarioTest.cmake"
        DESTINATION "${MULTIDEV_CMAKE_DIR}")

# pkg-config: the library is static, so its dependencies go in Libs (CAF has
# no .pc file; fmt does). System directories stay out of the flags.
get_filename_component(_caf_libdir "${CAF_CORE_LIBRARY}" DIRECTORY)
set(MULTIDEV_PC_CAF_LIBS "-lcaf_openssl -lcaf_io -lcaf_core -lssl -lcrypto")
if(NOT _caf_libdir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
  set(MULTIDEV_PC_CAF_LIBS "-L${_caf_libdir} ${MULTIDEV_PC_CAF_LIBS}")
endif()
set(MULTIDEV_PC_CAF_CFLAGS "")
if(NOT CAF_INCLUDE_DIR IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
  set(MULTIDEV_PC_CAF_CFLAGS "-I${CAF_INCLUDE_DIR}")
endif()
# Relocatable: the prefix is found from the .pc file's own directory, so
# `cmake --install --prefix` anywhere works.
file(RELATIVE_PATH MULTIDEV_PC_PREFIX_FROM_PCDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig"
     "/prefix")
string(REGEX REPLACE "/$" "" MULTIDEV_PC_PREFIX_FROM_PCDIR "${MULTIDEV_PC_PREFIX_FROM_PCDIR}")
configure_file("${PROJECT_SOURCE_DIR}/cmake/multidev.pc.in"
               "${PROJECT_BINARY_DIR}/multidev.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/multidev.pc"
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
# multidev-cuda: the CUDA runtime layer, for a program that wants the GPUs
# (multidev.pc itself names no CUDA library). cudart_static needs libdl and librt.
if(TARGET multidev_cuda)
  set(MULTIDEV_PC_CUDA_LIBS "-L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
  configure_file("${PROJECT_SOURCE_DIR}/cmake/multidev-cuda.pc.in"
                 "${PROJECT_BINARY_DIR}/multidev-cuda.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/multidev-cuda.pc"
          DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
endif()
