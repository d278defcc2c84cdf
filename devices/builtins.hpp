#pragma once
/// \file
/// What drivers share with the built-in kernels (devices/kernels.cpp).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "multidev/kernels.hpp"

namespace multidev::detail {

/// What the `checksum` kernel publishes for a float32 buffer: the sum of
/// its elements (in order, in double), the FNV-1a hash of its bytes and its
/// element count. One definition for every driver, so a CPU and a GPU
/// device publish the same result for the same bytes.
kernel_result checksum_of(std::span<const std::byte> bytes);

/// `checksum_of` over a buffer that arrives in parts, in order (each part a
/// whole number of floats): the same result as over the whole.
class checksum_state {
public:
  void add(std::span<const std::byte> bytes) noexcept;
  kernel_result result() const noexcept { return {sum_, hash_, count_}; }

private:
  uint64_t hash_ = 14695981039346656037ull;
  double sum_ = 0;
  std::size_t count_ = 0;
};

/// Whether `def` is the built-in kernel `name` as multidev defines it (not
/// a replacement registered under that name): a GPU driver runs its own
/// version of built-ins only.
bool is_builtin(const std::string& name, const kernel_def* def);

/// Throws std::invalid_argument unless `add_from_merge`'s call `c` fits:
/// DST (argument 0), the merge node (argument 1) and the merge buffer hold
/// as many bytes (the buffer may hold more). Every driver checks it before
/// adding.
void check_add_from_merge(const kernel_call& c);

} // namespace multidev::detail
