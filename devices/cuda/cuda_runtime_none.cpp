// `real_api()` in builds without the CUDA Toolkit: there is no runtime, so
// the CUDA driver reports no devices (tests use fake_cuda_api.hpp instead).
#include "devices/cuda/cuda_api.hpp"

namespace multidev::detail::cuda {

std::shared_ptr<api> real_api() {
  return nullptr;
}

bool built_with_cuda() noexcept {
  return false;
}

} // namespace multidev::detail::cuda
