// The pool table as of the end of the queue: allocate, replace, free and
// zero, ordered with the device's work.
#include "actors/device_core.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>

namespace multidev::detail {

pool::pool(int id, std::size_t size, std::size_t alignment,
           std::optional<memory_mode> mode, std::unique_ptr<allocation> mem,
           std::shared_ptr<std::atomic<std::size_t>> used)
  : id(id), size(size), alignment(alignment), mode(mode), mem(std::move(mem)),
    used(std::move(used)) {
  *this->used += size;
}

pool::~pool() {
  *used -= size;
}

void device_core::alloc_pool(int id, std::size_t size, std::size_t alignment,
                             std::optional<memory_mode> mode) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw std::invalid_argument(fmt::format(
      "alloc_pool on {}: pool {}: alignment {} is not a power of two", name_, id,
      alignment));
  if (id < 0)
    throw std::invalid_argument(
      fmt::format("alloc_pool on {}: pool id {} is negative", name_, id));
  // No block may exceed PTRDIFF_MAX bytes once rounded up to its alignment;
  // the drivers check their own rounding too, but a size this large is
  // refused before any of them sees it (a wrapped sum once gave a few bytes).
  constexpr std::size_t most = PTRDIFF_MAX;
  if (alignment > most || size > most - (alignment - 1))
    throw std::invalid_argument(fmt::format(
      "alloc_pool on {}: pool {}: {} bytes aligned to {} is more than any device can "
      "address (at most {} bytes)",
      name_, id, size, alignment, most));
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
  auto p = std::make_shared<pool>(id, size, alignment, mode, std::move(mem), used_);
  std::shared_ptr<pool> old;
  {
    std::lock_guard guard{pools_mu_};
    auto& slot = pools_[id];
    old = std::move(slot);
    slot = std::move(p);
  }
  // A replaced pool lives until the work scheduled before now is done.
  if (old)
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

namespace {
std::invalid_argument unknown_pool(std::string_view who, int id, const std::string& device) {
  return std::invalid_argument(fmt::format(
    "{}: pool {} is not allocated on {} (never allocated, or freed)", who, id, device));
}
} // namespace

void device_core::free_pool(int id) {
  std::shared_ptr<pool> old;
  {
    std::lock_guard guard{pools_mu_};
    auto i = pools_.find(id);
    if (i == pools_.end())
      throw unknown_pool("free_pool", id, name_);
    old = std::move(i->second);
    pools_.erase(i);
  }
  // Ordered with the device's work, like cudaFreeAsync.
  release_later(std::move(old), "free_pool");
}

std::shared_ptr<pool> device_core::pool_span(int id, std::size_t offset, std::size_t size,
                                             std::string_view who) const {
  auto p = try_pool(id);
  if (!p)
    throw unknown_pool(who, id, name_);
  // Never `offset + size > p->size`: the sum may wrap around.
  if (offset > p->size || size > p->size - offset) {
    auto span = size <= SIZE_MAX - offset
                  ? fmt::format("bytes [{}, {})", offset, offset + size)
                  : fmt::format("{} bytes at offset {}", size, offset);
    throw std::invalid_argument(fmt::format("{}: {} are outside pool {} of {} ({} bytes)",
                                            who, span, id, name_, p->size));
  }
  return p;
}

uint64_t device_core::memset_zero(int id, std::size_t offset, std::size_t size) {
  auto p = pool_span(id, offset, size, "memset_zero");
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
  auto p = pool_span(id, offset, bytes->size(), "write");
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
  auto p = pool_span(id, offset, out->size(), "read");
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

std::shared_ptr<pool> device_core::try_pool(int id) const {
  std::lock_guard guard{pools_mu_};
  auto i = pools_.find(id);
  return i == pools_.end() ? nullptr : i->second;
}

} // namespace multidev::detail
