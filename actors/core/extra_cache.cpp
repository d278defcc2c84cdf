// Orders' and waits' extras recycled between a runner and its producers
// (see extra_cache.hpp).
#include "actors/core/extra_cache.hpp"

#include <algorithm>
#include <mutex>

namespace multidev::detail {

std::unique_ptr<item_extra> extra_cache::take() {
  {
    std::lock_guard guard{spare_mu_};
    if (!spare_.empty()) {
      auto x = std::move(spare_.back());
      spare_.pop_back();
      // The runner read the next one last: ask for the two lines a push
      // writes now, so their transfer overlaps this push, not the next.
      if (!spare_.empty()) {
        auto* next = reinterpret_cast<const char*>(spare_.back().get());
        prefetch_for_write(next);
        prefetch_for_write(next + 64);
      }
      return x;
    }
  }
  return std::make_unique<item_extra>();
}

std::size_t extra_cache::spare_count() const {
  std::lock_guard guard{spare_mu_};
  return spare_.size();
}

void extra_cache::recycle(item& it) noexcept {
  it.work = nullptr; // its closure points into the extra
  // Only what must not outlive the item, and only when set: the other
  // fields stay as they are for the producer to overwrite, their lines
  // untouched here. An order's pool is let go of later, with the other
  // spent orders' (`let_go_of_spent_pools`: at a hand-back, a release, idle).
  if (auto& x = *it.extra.order_or_wait(); x.g)
    x.g.reset(); // a wait's gate goes with the wait
  auto x = it.extra.take_order_or_wait();
  try {
    spent_.push_back(std::move(x));
  } catch (...) {
    // Out of memory: freed instead (x, as it goes).
  }
}

void extra_cache::hand_back_extras_to_producers() noexcept {
  let_go_of_spent_pools();
  // A group at a time, under a lock of their own: handing back each one
  // moves spare_'s lines to this thread and back for every order, and under
  // the queue's lock it would take the queue's line from the producers once more. spare_
  // is sized once, its first time, and grows past that only in a burst;
  // out of memory, what does not fit is freed.
  {
    std::lock_guard guard{spare_mu_};
    // Doubling: reserve alone grows to exactly what is asked, and a burst
    // handed back 16 at a time would move the whole list every time.
    if (auto need = spare_.size() + spent_.size(); need > spare_.capacity()) {
      try {
        spare_.reserve(std::max({need, 2 * spare_.capacity(), spare_extras_max}));
      } catch (...) {
      }
    }
    while (!spent_.empty() && spare_.size() < spare_.capacity()) {
      spare_.push_back(std::move(spent_.back()));
      spent_.pop_back();
    }
  }
  spent_.clear(); // only when memory ran out
}

void extra_cache::trim_spare_extras() noexcept {
  // A slice at a time, so that a producer taking an extra meanwhile waits
  // for a short section only.
  constexpr std::size_t slice = 256;
  static_assert(slice <= spare_extras_max); // so n - slice below cannot wrap
  for (;;) {
    std::lock_guard guard{spare_mu_};
    auto n = spare_.size();
    if (n <= spare_extras_max) {
      if (spare_.capacity() > 4 * spare_extras_max) {
        try {
          spare_.shrink_to_fit();
        } catch (...) {
        }
      }
      return;
    }
    spare_.resize(std::max(spare_extras_max, n - slice));
  }
}

void extra_cache::let_go_of_spent_pools() noexcept {
  // In a row: the count's cache line moves from the host once for the
  // group, where letting go as each order ran moved it back and forth on
  // every copy (the host takes the same count for its next copy).
  for (auto& x : spent_)
    if (x->keep_alive) // else its line is left as it is
      x->keep_alive.reset();
}

void extra_cache::release_hold(item& it) noexcept {
  if (auto* n = it.extra.named_holding())
    n->keep_alive.reset();
  else if (auto* x = it.extra.order_or_wait())
    release_hold(*x);
}

void extra_cache::release_hold(item_extra& x) noexcept {
  if (!x.keep_alive || (x.is_order() && x.op.dst))
    return;
  if (x.is_order())
    let_go_of_spent_pools();
  x.keep_alive.reset();
}

} // namespace multidev::detail
