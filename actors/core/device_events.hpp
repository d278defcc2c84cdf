#pragma once
/// \file
/// Who waits for a device's seqs, and how they are told: resolvers and
/// messages registered by seq (kept by the `outcome_board`), other devices'
/// local waits (`gate_waiters`, registered without a resolver), and the
/// blocking syncs of host threads and tasks. The runner resolves items
/// (`device_core::complete`, `poison`); this fires what waited for them.
///
/// Invariants:
/// - A waiter is called exactly once, or dropped uncalled (`drop_waiter*`),
///   never both: firing takes the due ones out under the waiter lock first.
/// - Every waiter of a seq `<= upto` is fired by a `fire(upto)` that runs
///   after it is registered, or by its own registration, which reads the
///   progress after it enters (store-then-load against `complete`'s
///   publish-then-read of the waiters' minimum, see `outcome_board`): a
///   waiter that races with `complete` is never stranded.
/// - Each seq is told its own outcome: done stays done for every observer,
///   even when the device fails later.
/// - A sync on this device from one of its own tasks, on a seq not before
///   the task's, throws `deadlock_error` instead of blocking.
///
/// Threads: `sync*`, `when_*` and `drop_waiter*` from any thread (a sync
/// blocks; the others never do). `fire`: whoever resolves items (the runner,
/// or on an asynchronous driver the thread that holds the stream window's
/// retire lock), and the core's `shutdown`. The waiter lock
/// (`outcome_board::waiters_mutex`) guards the lists.
///
/// A member object of `device_core`: `fire` runs on every hop of a chain
/// (the runner's own hand-over, `try_claim`/`try_defer`, is asked there),
/// so it reaches the core's parts without a pointer chase beyond its own.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "actors/core/gate_waiters.hpp"
#include "actors/core/outcome_board.hpp"

namespace multidev::detail {

class device_core;

class device_events {
public:
  using failure_ptr = outcome_board::failure_ptr;
  using resolver = outcome_board::resolver;
  /// A resolver with the cause rendered (`describe()`), for callers that
  /// only pass a message on (`error == nullptr`: done).
  using waiter = std::function<void(const std::string* error)>;

  /// The core whose seqs these are (its name, schedule, runner and trace),
  /// and its outcome board; both outlive this object.
  device_events(device_core& core, outcome_board& outcomes) noexcept
    : core_(core), outcomes_(outcomes) {}
  device_events(const device_events&) = delete;
  device_events& operator=(const device_events&) = delete;

  /// Blocks until `seq` is done; throws `device_error` if it failed,
  /// `deadlock_error` when called from this runner on a seq ahead of it,
  /// `std::invalid_argument` when `seq` was never scheduled.
  void sync(uint64_t seq);
  /// `sync` that gives up at `deadline` (`time_point::max()`: never), with a
  /// `timeout_error` saying why `seq` is not done (`wait_chain`). From a
  /// task, also throws `deadlock_error` when the wait would close a cycle of
  /// runners (see wait_graph.hpp). `what` names the call in errors.
  void sync_until(uint64_t seq, std::chrono::steady_clock::time_point deadline,
                  const char* what = "sync");
  /// Calls `r` once `seq` is resolved (at once if it is): with nullptr when
  /// done, with its cause when it failed or was cancelled. An exception
  /// thrown by `r` is swallowed.
  void when_resolved(uint64_t seq, resolver r);
  /// Registers `w` (another device's wait, `device_core::push_wait`) with
  /// this (owner) device, or resolves it at once as `when_resolved` would
  /// call a resolver. Moves from `w` only once it is stored: when this
  /// throws (out of memory), `w` is as it was.
  void when_resolved(gate_waiter&& w);
  /// `when_resolved` with the cause rendered as a message naming the device.
  void when_done(uint64_t seq, waiter w);
  /// Forgets the waiters for which `pred` holds, uncalled (their requester
  /// is gone: a node that went away); returns how many.
  std::size_t drop_waiters(const std::function<bool(const resolver&)>& pred);
  /// Forgets one waiter of `seq` for which `pred` holds, uncalled (a sync
  /// that gave up at its deadline); false when there is none: it has fired,
  /// or is firing now.
  bool drop_waiter(uint64_t seq, const std::function<bool(const resolver&)>& pred);
  /// For tests: registers `w` without looking at progress, as a waiter does
  /// that loses the race with `complete` (it stores itself after the runner
  /// read the waiter minimum, and before it re-checks progress).
  void add_waiter_unchecked(uint64_t seq, waiter w);

  /// Fires the waiters of seqs up to `upto` with their outcomes; with
  /// `beyond`, also the waiters of seqs not resolved, with that cause (at
  /// shutdown). Never throws.
  void fire(uint64_t upto, const failure* beyond = nullptr) noexcept;
  /// How many waiters are registered (resolvers and other devices' waits).
  /// Call with the waiter lock held (debug info).
  std::size_t count_locked() const noexcept {
    return outcomes_.waiter_count_locked() + gate_waiters_.size_locked();
  }

private:
  /// Both `when_resolved`s: `enter()` under the waiter lock while `seq` is
  /// pending, else `resolve(cause)` at once (null cause: done).
  template <class Enter, class Resolve>
  void when_resolved_as(uint64_t seq, Enter&& enter, Resolve&& resolve);

  device_core& core_;
  outcome_board& outcomes_;
  /// Local waits of other devices on this one's seqs, registered without a
  /// resolver (see gate_waiters.hpp); guarded by the waiter lock
  /// (`outcomes_.waiters_mutex()`), whose minimum covers them.
  gate_waiters gate_waiters_;
};

} // namespace multidev::detail
