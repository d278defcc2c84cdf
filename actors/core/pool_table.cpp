// The pool table: ids to shared pools, and the memory they hold.
#include "actors/core/pool_table.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <mutex>
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

namespace {
std::invalid_argument unknown_pool(std::string_view who, int id, const std::string& device) {
  return std::invalid_argument(fmt::format(
    "{}: pool {} is not allocated on {} (never allocated, or freed)", who, id, device));
}
} // namespace

pool_table::pool_table(std::string device)
  : device_(std::move(device)), used_(std::make_shared<std::atomic<std::size_t>>(0)) {}

void pool_table::check_request(int id, std::size_t size, std::size_t alignment,
                               std::string_view who) const {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw std::invalid_argument(fmt::format(
      "{} on {}: pool {}: alignment {} is not a power of two", who, device_, id, alignment));
  if (id < 0)
    throw std::invalid_argument(
      fmt::format("{} on {}: pool id {} is negative", who, device_, id));
  // No block may exceed PTRDIFF_MAX bytes once rounded up to its alignment;
  // the drivers check their own rounding too, but a size this large is
  // refused before any of them sees it (a wrapped sum once gave a few bytes).
  constexpr std::size_t most = PTRDIFF_MAX;
  if (alignment > most || size > most - (alignment - 1))
    throw std::invalid_argument(fmt::format(
      "{} on {}: pool {}: {} bytes aligned to {} is more than any device can "
      "address (at most {} bytes)",
      who, device_, id, size, alignment, most));
}

std::shared_ptr<pool> pool_table::install(int id, std::size_t size, std::size_t alignment,
                                          std::optional<memory_mode> mode,
                                          std::unique_ptr<allocation> mem,
                                          std::shared_ptr<pool>* made) {
  auto p = std::make_shared<pool>(id, size, alignment, mode, std::move(mem), used_);
  if (made)
    *made = p;
  std::lock_guard guard{mu_};
  auto& slot = pools_[id];
  auto old = std::move(slot);
  slot = std::move(p);
  return old;
}

std::shared_ptr<pool> pool_table::remove(int id, std::string_view who) {
  std::lock_guard guard{mu_};
  auto i = pools_.find(id);
  if (i == pools_.end())
    throw unknown_pool(who, id, device_);
  auto old = std::move(i->second);
  pools_.erase(i);
  return old;
}

std::shared_ptr<pool> pool_table::put_back(int id, std::shared_ptr<pool> old,
                                           const std::shared_ptr<pool>& installed) {
  std::lock_guard guard{mu_};
  auto i = pools_.find(id);
  if ((i == pools_.end() ? nullptr : i->second) != installed)
    return old; // changed since: left as it is
  std::shared_ptr<pool> out;
  if (i != pools_.end()) {
    out = std::move(i->second);
    if (old)
      i->second = std::move(old);
    else
      pools_.erase(i);
  } else if (old) {
    pools_.emplace(id, std::move(old));
  }
  return out;
}

std::shared_ptr<pool> pool_table::find(int id) const {
  std::lock_guard guard{mu_};
  auto i = pools_.find(id);
  return i == pools_.end() ? nullptr : i->second;
}

std::shared_ptr<pool> pool_table::span(int id, std::size_t offset, std::size_t size,
                                       std::string_view who) const {
  auto p = find(id);
  if (!p)
    throw unknown_pool(who, id, device_);
  // Never `offset + size > p->size`: the sum may wrap around.
  if (offset > p->size || size > p->size - offset) {
    auto span = size <= SIZE_MAX - offset
                  ? fmt::format("bytes [{}, {})", offset, offset + size)
                  : fmt::format("{} bytes at offset {}", size, offset);
    throw std::invalid_argument(fmt::format("{}: {} are outside pool {} of {} ({} bytes)",
                                            who, span, id, device_, p->size));
  }
  return p;
}

void pool_table::clear() noexcept {
  // Out of the lock: a pool's last reference frees its memory.
  std::map<int, std::shared_ptr<pool>> gone;
  {
    std::lock_guard guard{mu_};
    gone.swap(pools_);
  }
}

sexp pool_table::info() const {
  auto pools = sexp::list({sexp::atom("pools")});
  std::lock_guard guard{mu_};
  for (const auto& [id, p] : pools_)
    pools.push_back(sexp::list(
      {sexp::atom("pool"), sexp::field("id", std::to_string(id)),
       sexp::field("size", std::to_string(p->size)),
       sexp::field("alignment", std::to_string(p->alignment)),
       sexp::field("mode", p->mode ? to_string(*p->mode) : std::string{"none"})}));
  return pools;
}

} // namespace multidev::detail
