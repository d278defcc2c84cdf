#pragma once
/// \file
/// What the `checksum` kernel publishes for a float32 buffer: the sum of its
/// elements (in order, in double), the FNV-1a hash of its bytes and its
/// element count. One definition for every driver, so a CPU and a GPU
/// device publish the same result for the same bytes.

#include <cstddef>
#include <span>

#include "multidev/kernels.hpp"

namespace multidev::detail {

kernel_result checksum_of(std::span<const std::byte> bytes);

} // namespace multidev::detail
