// `real_api()`: the CUDA runtime layer, when the program links it. The layer
// (cuda_runtime.cpp and the kernels of cuda_kernels.cu) is a library of its
// own, multidev_cuda (`multidev::cuda` once installed), so that a program
// linking only the core library needs neither the CUDA Toolkit nor libcudart,
// not even to be built; its "cuda" backend then has no device and says why.
// The layer's entry point is declared weak here: null unless it is linked
// (multidev_cuda's link option makes the linker take cuda_runtime.cpp).
#include "devices/cuda/cuda_api.hpp"

namespace multidev::detail::cuda {

/// Defined in cuda_runtime.cpp.
[[gnu::weak]] std::shared_ptr<api> linked_runtime_api();

std::shared_ptr<api> real_api() {
  return linked_runtime_api != nullptr ? linked_runtime_api() : nullptr;
}

bool built_with_cuda() noexcept {
  return linked_runtime_api != nullptr;
}

std::string no_runtime_reason() {
#ifdef MULTIDEV_HAVE_CUDA
  return "this program has no CUDA runtime: it does not link multidev::cuda (CMake: "
         "find_package(multidev COMPONENTS cuda) and multidev::cuda; pkg-config: multidev-cuda)";
#else
  return "this build has no CUDA runtime (configured with MULTIDEV_CUDA=OFF or without the "
         "CUDA Toolkit)";
#endif
}

} // namespace multidev::detail::cuda
