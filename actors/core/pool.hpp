#pragma once
/// \file
/// One device pool: a block of device memory shared by the pool table and
/// every queued task that uses it.

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>

#include "devices/driver.hpp"
#include "multidev/types.hpp"

namespace multidev::detail {

/// One pool: its memory and what it was allocated as. Shared by the table and
/// by every queued item that uses it, so memory outlives the work using it.
struct pool {
  pool(int id, std::size_t size, std::size_t alignment,
       std::optional<memory_mode> mode, std::unique_ptr<allocation> mem,
       std::shared_ptr<std::atomic<std::size_t>> used);
  ~pool();
  std::byte* base() const noexcept { return mem->base(); }
  std::span<std::byte> bytes() const noexcept { return {mem->base(), size}; }

  int id;
  std::size_t size;
  std::size_t alignment;
  std::optional<memory_mode> mode;
  std::unique_ptr<allocation> mem;
  std::shared_ptr<std::atomic<std::size_t>> used;
};

} // namespace multidev::detail
