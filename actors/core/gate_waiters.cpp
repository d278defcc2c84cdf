// The gate waiters of one device (see gate_waiters.hpp).
#include "actors/core/gate_waiters.hpp"

#include <algorithm>

#include "actors/core/device_core.hpp"

namespace multidev::detail {

void gate_waiters::add_locked(gate_waiter&& w) {
  const auto seq = w.seq;
  // Kept in seq order: appended in the common case.
  if (head_ == list_.size() || list_.back().seq <= seq) {
    list_.push_back(std::move(w));
    return;
  }
  auto at = std::upper_bound(list_.begin() + static_cast<std::ptrdiff_t>(head_), list_.end(), seq,
                             [](uint64_t s, const gate_waiter& x) { return s < x.seq; });
  list_.insert(at, std::move(w));
}

void gate_waiters::update_min_locked(outcome_board& board, bool raised) const noexcept {
  board.set_min_waiter_locked(std::min(board.first_waiter_locked(), first_locked()), raised);
}

bool gate_waiters::take_due_locked(uint64_t upto, bool all, gate_waiter& out,
                                   bool& more) noexcept {
  more = false;
  if (head_ == list_.size())
    return false;
  auto& first = list_[head_];
  if (!all && first.seq > upto)
    return false;
  out = std::move(first);
  more = head_ + 1 < list_.size() && (all || list_[head_ + 1].seq <= upto);
  // Spent entries are erased in bulk, once they are half of the list (and
  // at once when it empties): a move per entry, amortized, no allocation.
  if (++head_ == list_.size()) {
    list_.clear();
    head_ = 0;
  } else if (head_ >= 64 && 2 * head_ >= list_.size()) {
    list_.erase(list_.begin(), list_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
  return true;
}

void gate_waiters::resolve(const gate_waiter& w, const failure* cause) noexcept {
  // On the waiter's own runner thread (a chain's hop, run here by hand-over,
  // opening the wait of the device that lent this thread), the waiter
  // outlives this call: no reference taken, two locked instructions a hop
  // fewer.
  std::shared_ptr<device_core> held;
  device_core* me = home_runner;
  if (!me || w.waiter_at != me) {
    held = w.waiter.lock();
    me = held.get();
  }
  if (!me)
    return;
  // An ordering-only wait ends however the awaited item resolved.
  if (!cause || w.g->order_only) {
    me->resolve_gate(*w.g, outcome_board::failure_ptr{});
    return;
  }
  outcome_board::failure_ptr shared;
  try {
    shared = std::make_shared<const failure>(*cause);
  } catch (...) {
  }
  me->resolve_gate(*w.g, shared ? shared : unknown_gate_cause());
}

} // namespace multidev::detail
