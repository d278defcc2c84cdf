// A device's pool operations, ordered with its work: allocate, replace,
// free, zero, and copies in and out (the table itself: pool_table.cpp).
#include "actors/core/device_core.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>

namespace multidev::detail {

void device_core::alloc_pool(int id, std::size_t size, std::size_t alignment,
                             std::optional<memory_mode> mode) {
  pools_.check_request(id, size, alignment, "alloc_pool");
  check();
  if (stopping())
    throw device_error(name_, "device is shut down; no new pool is accepted");
  std::unique_ptr<allocation> mem;
  try {
    mem = driver_->allocate(ordinal_, size, alignment, mode);
  } catch (const std::bad_alloc&) {
    throw std::invalid_argument(fmt::format(
      "alloc_pool on {}: pool {}: cannot allocate {} bytes aligned to {}", name_,
      id, size, alignment));
  }
  // A replaced pool lives until the work scheduled before now is done.
  if (auto old = pools_.install(id, size, alignment, mode, std::move(mem)))
    release_later(std::move(old), "release replaced pool");
}

void device_core::release_later(std::shared_ptr<pool> old, const char* what) {
  // A failed or stopping device runs nothing more: the memory goes at once.
  if (failed())
    return;
  order o;
  o.what = what;
  o.id = old->id;
  o.naming = order::pool;
  try {
    push_order(o, trace_kind::pool, {}, std::move(old));
  } catch (const device_error&) {
  }
}

void device_core::free_pool(int id) {
  // Ordered with the device's work, like cudaFreeAsync.
  release_later(pools_.remove(id, "free_pool"), "free_pool");
}

uint64_t device_core::memset_zero(int id, std::size_t offset, std::size_t size) {
  auto p = pools_.span(id, offset, size, "memset_zero");
  order o;
  o.dst = p->base() + offset;
  o.bytes = size;
  o.what = "memset_zero";
  o.id = id;
  o.naming = order::pool_span;
  o.offset = offset;
  return push_order(o, trace_kind::memset, {}, std::move(p));
}

uint64_t device_core::write_bytes(int id, std::size_t offset,
                                  std::shared_ptr<const std::string> bytes) {
  auto p = pools_.span(id, offset, bytes->size(), "write");
  auto* d = driver_.get();
  auto n = bytes->size();
  return push(task{fmt::format("write pool {} [{}, {})", id, offset, offset + n),
                   [d, p, offset, bytes] {
                     d->copy(p->base() + offset, reinterpret_cast<const std::byte*>(bytes->data()),
                             bytes->size());
                   },
                   {},
                   trace_kind::copy},
              false);
}

uint64_t device_core::read_bytes(int id, std::size_t offset, std::shared_ptr<std::string> out) {
  auto p = pools_.span(id, offset, out->size(), "read");
  auto* d = driver_.get();
  auto n = out->size();
  return push(task{fmt::format("read pool {} [{}, {})", id, offset, offset + n),
                   [d, p, offset, out] {
                     d->copy(reinterpret_cast<std::byte*>(out->data()), p->base() + offset,
                             out->size());
                   },
                   {},
                   trace_kind::copy},
              false);
}

} // namespace multidev::detail
