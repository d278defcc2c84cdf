#pragma once
/// \file
/// The gate waiters of one device (the owner): the gates of other devices
/// of this process that open once a seq of the owner is resolved (local
/// `will_wait_for`s), registered without a resolver. A resolver and its
/// multimap node (`outcome_board`'s waiter list) were two allocations a
/// wait, made by the host and freed by the owner's runner; in glibc that
/// cross-thread pattern (consolidation, unsorted-bin sorting) was most of
/// the host's time in a chain scheduled while it runs. Here a wait is one
/// entry of a vector whose storage is reused.
///
/// Invariants:
/// - The entries from the head on are the waiters, sorted by seq (appended
///   in the common case: a host schedules waits in seq order). The entries
///   before the head are spent (taken), compacted away in bulk: at once
///   when the list empties, else once they are at least 64 and half of it.
///   So appending a wait allocates nothing once the list has grown, and
///   taking one moves one entry, amortized.
/// - Every waiter added is taken once (`take_due_locked`), in seq order; the
///   owner then opens or fails its gate (`resolve`), or hands the waiting
///   device over (`hand_over::try_claim`, `try_defer`).
/// - The owner's outcome board stores a minimum at most the seq of every
///   waiter listed here and there (`update_min_locked`), so that a `publish`
///   that passes a waiter's seq reports it due.
///
/// Threads: the list (`*_locked`) is guarded by the owner's outcome board's
/// waiter lock (`outcome_board::waiters_mutex()`), which its own waiter list
/// shares: a firing takes one lock for both. `resolve`: any thread, without
/// that lock (it opens a gate and rings its runner).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "actors/core/gate.hpp"
#include "actors/core/outcome_board.hpp"

namespace multidev::detail {

class device_core;

/// A gate of another device (`waiter`) that opens once `seq` of the owner
/// is resolved: a local `will_wait_for`, registered without a resolver.
struct gate_waiter {
  uint64_t seq = 0;
  std::shared_ptr<gate> g;
  std::weak_ptr<device_core> waiter;
  /// `waiter`'s address, to tell without a reference whether it is the
  /// device whose runner thread fires it (`home_runner`); never
  /// dereferenced.
  const device_core* waiter_at = nullptr;
};

class gate_waiters {
public:
  // -- Under the waiter lock ------------------------------------------------------

  /// Lists `w`, in seq order (the registration half of
  /// `device_events::when_resolved`; the caller then updates the minimum).
  /// Moves from `w` only once it is stored: when this throws (out of
  /// memory), `w` is as it was.
  void add_locked(gate_waiter&& w);
  /// The least seq waited for here, `UINT64_MAX` when none.
  uint64_t first_locked() const noexcept {
    return head_ < list_.size() ? list_[head_].seq : UINT64_MAX;
  }
  /// Stores the waiters' minimum from both lists (`board`'s and this one)
  /// in `board` (`outcome_board::set_min_waiter_locked`). `raised`: the
  /// caller only took waiters out (a firing), so the value can only go up.
  void update_min_locked(outcome_board& board, bool raised = false) const noexcept;
  /// Takes the first waiter if it is due (`seq <= upto`, or any when `all`)
  /// into `out`; `more`: whether the one after it is due too. Whether it
  /// took one. Allocates nothing.
  bool take_due_locked(uint64_t upto, bool all, gate_waiter& out, bool& more) noexcept;
  /// Waiters listed.
  std::size_t size_locked() const noexcept { return list_.size() - head_; }
  /// Entries held, spent ones not yet compacted away included (for tests).
  std::size_t slots_locked() const noexcept { return list_.size(); }

  // -- Any thread, without the lock ----------------------------------------------

  /// Opens (or fails) `w`'s gate on its waiting device, if that still lives
  /// (`cause == nullptr`: the awaited seq is done; an ordering-only wait
  /// opens whatever `cause` is).
  static void resolve(const gate_waiter& w, const failure* cause) noexcept;

private:
  /// Sorted by seq from `head_` on (the entries before it are spent).
  std::vector<gate_waiter> list_;
  std::size_t head_ = 0;
};

} // namespace multidev::detail
