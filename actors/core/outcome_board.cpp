// The outcome board: what became of each seq, why, and who is told.
#include "actors/core/outcome_board.hpp"

namespace multidev::detail {

namespace {
// Made at load time: it stands in when memory runs out.
const failure unreadable_cause{failure::kind::failed, {}, {}, 0,
                               "failed (its cause could not be read)", {}};
} // namespace

outcome_board::outcome_board(const std::string& device)
  : oom_cause_(std::make_shared<const failure>(
      failure{failure::kind::failed, device, {}, 0, "task failed", {}})) {}

outcome_board::failure_ptr outcome_board::cause_of(uint64_t seq) const {
  // progress_ is read first: bad_max_ is published before progress_ passes
  // a bad seq, so a seq above bad_max_ that progress covers is done.
  if (seq == 0 || seq > progress_.load(std::memory_order_acquire) ||
      seq > bad_max_.load(std::memory_order_acquire))
    return nullptr;
  std::lock_guard guard{bad_mu_};
  auto i = bad_.upper_bound(seq);
  if (i == bad_.begin())
    return nullptr;
  --i;
  return seq <= i->second.last ? i->second.cause : nullptr;
}

bool outcome_board::is_done_slow(uint64_t seq) const noexcept {
  try {
    return cause_of(seq) == nullptr;
  } catch (...) {
    return false; // a lock that throws: not known to be done
  }
}

bool outcome_board::is_failed(uint64_t seq) const noexcept {
  if (seq > progress_.load(std::memory_order_acquire) ||
      seq > bad_max_.load(std::memory_order_acquire))
    return false;
  try {
    return cause_of(seq) != nullptr;
  } catch (...) {
    return false;
  }
}

event_state outcome_board::state(uint64_t seq) const {
  if (seq > finished())
    return event_state::pending;
  auto c = cause_of(seq);
  if (!c)
    return event_state::done;
  return c->is_cancellation() ? event_state::cancelled : event_state::failed;
}

const failure* outcome_board::outcome_for(uint64_t seq, uint64_t resolved,
                                          const failure* beyond,
                                          failure_ptr& hold) const noexcept {
  // Each seq gets its own outcome: a seq resolved done is done for every
  // observer, even when this fires because the device failed later.
  if (seq > resolved)
    return beyond;
  try {
    hold = cause_of(seq);
  } catch (...) {
    return &unreadable_cause;
  }
  return hold.get();
}

void outcome_board::record_bad(uint64_t seq, failure_ptr cause) noexcept {
  if (!cause)
    cause = oom_cause_;
  try {
    std::lock_guard guard{bad_mu_};
    // Consecutive seqs with one cause share a range (a cancel of thousands
    // of items is one entry).
    auto extend = !bad_.empty() && std::prev(bad_.end())->second.last + 1 == seq &&
                  std::prev(bad_.end())->second.cause == cause;
    if (extend)
      std::prev(bad_.end())->second.last = seq;
    else
      bad_.emplace(seq, bad_range{seq, std::move(cause)});
    bad_max_.store(seq, std::memory_order_release);
  } catch (...) {
    // Out of memory recording the outcome: the seq must still resolve, and
    // must not read as done. The previous range grows over it.
    std::lock_guard guard{bad_mu_};
    if (!bad_.empty())
      std::prev(bad_.end())->second.last = seq;
    bad_max_.store(seq, std::memory_order_release);
  }
}

void outcome_board::record_dropped(uint64_t seq) noexcept {
  failure_ptr cause;
  {
    std::lock_guard guard{bad_mu_};
    // The first drop that covers seq; those behind it are spent.
    while (!drops_.empty() && drops_.front().first < seq)
      drops_.pop_front();
    if (!drops_.empty())
      cause = drops_.front().second;
  }
  record_bad(seq, std::move(cause));
}

bool outcome_board::drop_through(uint64_t upto, const failure_ptr& cause) noexcept {
  if (upto <= drop_upto_.load(std::memory_order_relaxed))
    return false;
  // Under bad_mu_, so that the resolving thread, once it sees the new
  // watermark, finds its cause (`record_dropped` takes the lock after this
  // section). The watermark first: should recording the cause fail, the
  // seqs still drop (with the fallback cause) rather than run.
  std::lock_guard guard{bad_mu_};
  drop_upto_.store(upto, std::memory_order_seq_cst);
  try {
    drops_.emplace_back(upto, cause);
  } catch (...) {
  }
  return true;
}

std::size_t outcome_board::drop_waiters_locked(const std::function<bool(const resolver&)>& pred) {
  std::size_t n = 0;
  for (auto i = waiters_.begin(); i != waiters_.end();) {
    if (pred(i->second)) {
      i = waiters_.erase(i);
      ++n;
    } else {
      ++i;
    }
  }
  return n;
}

bool outcome_board::drop_waiter_locked(uint64_t seq,
                                       const std::function<bool(const resolver&)>& pred) {
  auto [first, last] = waiters_.equal_range(seq);
  for (auto i = first; i != last; ++i) {
    if (pred(i->second)) {
      waiters_.erase(i);
      return true;
    }
  }
  return false;
}

void outcome_board::invoke(resolver& r, const failure* cause) noexcept {
  try {
    r(cause);
  } catch (...) {
    // A waiter's own failure is its business: the others still fire.
  }
}

} // namespace multidev::detail
