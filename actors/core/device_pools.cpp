// A device's pool operations, ordered with its work: allocate, replace,
// free, zero, and copies in and out (the table itself: pool_table.cpp).
#include "actors/core/device_memory.hpp"

#include "actors/core/device_core.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>

namespace multidev::detail {

void device_memory::alloc_pool(int id, std::size_t size, std::size_t alignment,
                               std::optional<memory_mode> mode) {
  // A replaced pool lives until the work scheduled before now is done.
  if (auto old = replace_pool(id, size, alignment, mode))
    release_later(std::move(old), "release replaced pool");
}

std::shared_ptr<pool> device_memory::replace_pool(int id, std::size_t size,
                                                  std::size_t alignment,
                                                  std::optional<memory_mode> mode,
                                                  std::shared_ptr<pool>* made) {
  table_.check_request(id, size, alignment, "alloc_pool");
  core_.life().check();
  if (core_.life().stopping())
    throw device_error(core_.name(), "device is shut down; no new pool is accepted");
  std::unique_ptr<allocation> mem;
  try {
    mem = core_.drv().allocate(core_.ordinal(), size, alignment, mode);
  } catch (const std::bad_alloc&) {
    throw std::invalid_argument(fmt::format(
      "alloc_pool on {}: pool {}: cannot allocate {} bytes aligned to {}", core_.name(),
      id, size, alignment));
  }
  return table_.install(id, size, alignment, mode, std::move(mem), made);
}

std::shared_ptr<pool> device_memory::take_pool(int id) {
  return table_.remove(id, "free_pool");
}

void device_memory::put_back(int id, std::shared_ptr<pool> old,
                             const std::shared_ptr<pool>& installed) {
  table_.put_back(id, std::move(old), installed); // dropped here, outside the lock
}

void device_memory::release_later(std::shared_ptr<pool> old, const char* what) {
  // A failed or stopping device runs nothing more: the memory goes at once.
  if (core_.life().failed())
    return;
  device_core::order o;
  o.what = what;
  o.id = old->id;
  o.naming = device_core::order::pool;
  try {
    core_.push_order(o, trace_kind::pool, {}, std::move(old));
  } catch (const device_error&) {
  }
}

void device_memory::free_pool(int id) {
  // Ordered with the device's work, like cudaFreeAsync.
  release_later(table_.remove(id, "free_pool"), "free_pool");
}

uint64_t device_memory::memset_zero(int id, std::size_t offset, std::size_t size) {
  auto p = table_.span(id, offset, size, "memset_zero");
  device_core::order o;
  o.dst = p->base() + offset;
  o.bytes = size;
  o.what = "memset_zero";
  o.id = id;
  o.naming = device_core::order::pool_span;
  o.offset = offset;
  return core_.push_order(o, trace_kind::memset, {}, std::move(p));
}

uint64_t device_memory::write_bytes(int id, std::size_t offset,
                                    std::shared_ptr<const std::string> bytes) {
  auto p = table_.span(id, offset, bytes->size(), "write");
  auto* d = &core_.drv();
  auto n = bytes->size();
  return core_.push(task{fmt::format("write pool {} [{}, {})", id, offset, offset + n),
                   [d, p, offset, bytes] {
                     d->copy(p->base() + offset, reinterpret_cast<const std::byte*>(bytes->data()),
                             bytes->size());
                   },
                   {},
                   trace_kind::copy},
              false);
}

uint64_t device_memory::read_bytes(int id, std::size_t offset, std::shared_ptr<std::string> out) {
  auto p = table_.span(id, offset, out->size(), "read");
  auto* d = &core_.drv();
  auto n = out->size();
  return core_.push(task{fmt::format("read pool {} [{}, {})", id, offset, offset + n),
                   [d, p, offset, out] {
                     d->copy(reinterpret_cast<std::byte*>(out->data()), p->base() + offset,
                             out->size());
                   },
                   {},
                   trace_kind::copy},
              false);
}

} // namespace multidev::detail
