#pragma once
/// \file
/// The outcome board of one device: how far its schedule has resolved, which
/// seqs failed or were cancelled and why (their provenance), which seqs are
/// dropped rather than run, and who is told when a seq resolves.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "actors/core/spin.hpp"
#include "multidev/types.hpp"

namespace multidev::detail {

/// A device resolves its items in seq order, each once: done, failed or
/// cancelled. Every thread asks what became of a seq (a host's `await`, a
/// wait of another device, the wait graph), and many register to be told;
/// only the thread that resolves items writes. This board keeps those
/// answers apart from the queue and the runner that produce them.
///
/// Invariants:
/// - `finished()` only grows. A seq at or below it is resolved, for good:
///   done, or listed in the bad ranges with its cause. A seq above it is
///   pending.
/// - A seq that resolved done stays done for every observer, whatever the
///   device does later (fails, is killed, shuts down).
/// - The bad ranges are disjoint, sorted, and consecutive seqs with one cause
///   share a range; `bad_max_` is their last seq, published before
///   `finished()` passes it, so a seq above it that `finished()` covers is
///   done without a lookup (the hot `is_done`).
/// - Seqs up to `dropped_upto()` are resolved without running, each with the
///   cause of the first drop that covers it (oldest first).
/// - Every waiter stored is called once, or dropped uncalled by
///   `drop_waiter(s)_locked`: a firing takes it out of the list before it
///   calls it. The stored minimum is at most the seq of every waiter listed
///   (including the device's gate waiters, which share the lock), so a
///   `publish` that passes a waiter's seq reports it due.
///
/// Threads:
/// - Readers (`finished`, `is_done`, `is_failed`, `cause_of`, `state`,
///   `outcome_for`): any thread.
/// - Resolving (`record_bad`, `record_dropped`, `publish`): the thread that
///   resolves the device's items, one at a time, in seq order (the runner, or
///   on an asynchronous driver whoever holds the device's retire lock).
/// - `drop_through`: any thread, serialized by the caller (the device's
///   queue lock, under which the schedule it drops is read).
/// - `*_locked`: any thread holding `waiters_mutex()`. The device keeps its
///   gate waiters (another list of the same waits) under that lock too, and
///   folds their minimum in (`set_min_waiter_locked`).
/// Nothing here blocks, except a short lock; nothing calls a waiter while
/// holding one.
class outcome_board {
public:
  /// Why a seq did not complete; shared by every seq it resolves.
  using failure_ptr = std::shared_ptr<const failure>;
  /// Called once a seq resolves: `cause == nullptr` when done.
  using resolver = std::function<void(const failure* cause)>;
  /// Waiters by seq: the list, and the ones a firing takes out.
  using waiter_list = std::multimap<uint64_t, resolver>;

  /// `device`: the name a failure carries when its cause cannot be made
  /// (out of memory; see `fallback_cause`).
  explicit outcome_board(const std::string& device);

  outcome_board(const outcome_board&) = delete;
  outcome_board& operator=(const outcome_board&) = delete;

  // -- Reading (any thread) ----------------------------------------------------

  /// The last seq resolved (done, failed or cancelled).
  uint64_t finished() const noexcept { return progress_.load(std::memory_order_acquire); }
  /// Whether `seq` resolved done. Once true, true forever.
  bool is_done(uint64_t seq) const noexcept {
    if (seq > progress_.load(std::memory_order_acquire))
      return false;
    if (seq > bad_max_.load(std::memory_order_acquire)) [[likely]]
      return true;
    return is_done_slow(seq);
  }
  /// Whether `seq` resolved failed or cancelled: it never will be done.
  bool is_failed(uint64_t seq) const noexcept;
  /// Why a resolved seq did not complete (its provenance); null when it is
  /// done or pending.
  failure_ptr cause_of(uint64_t seq) const;
  /// Pending, done, failed or cancelled.
  event_state state(uint64_t seq) const;
  /// The cause a waiter of `seq` gets from a firing that read `finished()`
  /// as `resolved`: null when done, the recorded cause, `beyond` when `seq`
  /// is past `resolved` (a firing of everything at shutdown), or a static
  /// stand-in when the table cannot be read. `hold` keeps the returned cause
  /// alive.
  const failure* outcome_for(uint64_t seq, uint64_t resolved, const failure* beyond,
                             failure_ptr& hold) const noexcept;

  // -- Resolving (the resolving thread, in seq order) --------------------------

  /// Records `seq` (the next to resolve) as failed or cancelled with `cause`
  /// (null: `fallback_cause()`); the caller then `publish`es it. Out of
  /// memory, the previous range grows over `seq`: it still never reads as
  /// done.
  void record_bad(uint64_t seq, failure_ptr cause) noexcept;
  /// `record_bad` for a dropped seq (at or below `dropped_upto()`), with the
  /// cause of the drop that covers it.
  void record_dropped(uint64_t seq) noexcept;
  /// Resolves everything up to `seq`; whether a waiter is due (the caller
  /// then fires them). Store, then load: against a registration's store of
  /// the minimum and load of the progress (`set_min_waiter_locked`,
  /// `progress_now`), so that one of the two sides sees the other.
  bool publish(uint64_t seq) noexcept {
    progress_.store(seq, std::memory_order_seq_cst);
    return seq >= min_waiter_.load(std::memory_order_seq_cst);
  }
  /// The cause that stands in when one cannot be made (out of memory).
  const failure_ptr& fallback_cause() const noexcept { return oom_cause_; }

  // -- Drops -------------------------------------------------------------------

  /// Seqs up to this one are dropped (cancel, kill, failure), not run. Only
  /// grows.
  uint64_t dropped_upto(std::memory_order order = std::memory_order_acquire) const noexcept {
    return drop_upto_.load(order);
  }
  /// Drops every seq up to `upto` that is not dropped yet, with `cause`;
  /// false, changing nothing, when `upto` is not past `dropped_upto()`.
  /// Callers are serialized (the device's queue lock). Should recording the
  /// cause fail (out of memory), the seqs still drop, with the fallback
  /// cause. Never throws.
  bool drop_through(uint64_t upto, const failure_ptr& cause) noexcept;

  // -- Waiters (under waiters_mutex()) -----------------------------------------

  /// The lock of the waiter list. A spin lock: a host scheduling a chain
  /// registers each wait here while the runner fires the last one, and a
  /// std::mutex then slept in the kernel on both sides (futex wait and
  /// wake: 8% of a scheduled chain's samples). Its sections are short.
  spin_mutex& waiters_mutex() const noexcept { return waiters_mu_; }
  /// The progress, read in the order a registration needs (see `publish`).
  uint64_t progress_now() const noexcept { return progress_.load(std::memory_order_seq_cst); }
  /// Whether a waiter of `seq` registered now is stored: the board is open
  /// and `seq` is pending (`progress_now()` below it).
  bool accepts_locked(uint64_t seq) const noexcept { return !closed_ && progress_now() < seq; }
  /// Stores a waiter of `seq`. The caller then updates the minimum.
  void add_locked(uint64_t seq, resolver&& r) { waiters_.emplace(seq, std::move(r)); }
  /// The least seq waited for here, `UINT64_MAX` when none.
  uint64_t first_waiter_locked() const noexcept {
    return waiters_.empty() ? UINT64_MAX : waiters_.begin()->first;
  }
  /// Stores `m`, the least seq of every waiter under this lock (this list's
  /// and the device's gate waiters'), as the minimum `publish` compares with.
  /// `raised`: the caller only took waiters out (a firing), so the value can
  /// only go up, and a release store does.
  void set_min_waiter_locked(uint64_t m, bool raised) noexcept {
    // Only a change is stored. A host scheduling ahead appends waits behind
    // the first, which stays the minimum, and the store (a locked
    // instruction on the line the runner writes progress_ to) would write
    // the value already there. Every writer holds the lock, so an unchanged
    // value is one the runner reads already.
    if (min_waiter_.load(std::memory_order_relaxed) == m)
      return;
    // A firing raises the minimum: every value stored while a waiter is
    // listed is at most its seq, so a runner that reads an older value still
    // fires for it. Only a registration's store pairs with a progress store
    // and needs the sequentially consistent one; a firing's took an `xchg`
    // on the progress line on every hop of a chain.
    if (raised)
      min_waiter_.store(m, std::memory_order_release);
    else
      min_waiter_.store(m, std::memory_order_seq_cst);
  }
  /// Moves the waiters of seqs up to `upto` (every one, with `all`) into
  /// `due`. Allocates nothing (the nodes move), so nothing can throw half
  /// way and strand a waiter.
  void take_due_locked(uint64_t upto, bool all, waiter_list& due) noexcept {
    auto end = all ? waiters_.end() : waiters_.upper_bound(upto);
    while (waiters_.begin() != end)
      due.insert(waiters_.extract(waiters_.begin()));
  }
  /// Forgets, uncalled, the waiters for which `pred` holds; how many.
  std::size_t drop_waiters_locked(const std::function<bool(const resolver&)>& pred);
  /// Forgets, uncalled, one waiter of `seq` for which `pred` holds; false
  /// when there is none (it fired, or is firing now).
  bool drop_waiter_locked(uint64_t seq, const std::function<bool(const resolver&)>& pred);
  /// How many waiters are stored.
  std::size_t waiter_count_locked() const noexcept { return waiters_.size(); }
  /// Closes the board (the device shut down): later waiters of seqs not
  /// resolved are not stored (`accepts_locked`).
  void close_locked() noexcept { closed_ = true; }

  /// Calls `r` with `cause`, swallowing what it throws: a waiter's own
  /// failure is its business, the others still fire.
  static void invoke(resolver& r, const failure* cause) noexcept;

private:
  bool is_done_slow(uint64_t seq) const noexcept;

  // The line the resolving thread writes (progress_) and everyone reads.
  // Resolved seq; the least awaited seq, which lets the runner skip the
  // waiter lock.
  alignas(64) std::atomic<uint64_t> progress_{0};
  std::atomic<uint64_t> min_waiter_{UINT64_MAX};
  // Items up to this seq are dropped, not run (cancel, kill, failure).
  // Written rarely (drop_through); read by the runner once per item.
  std::atomic<uint64_t> drop_upto_{0};
  // The largest seq that resolved failed or cancelled (0: none), published
  // before progress_ passes it, so is_done skips the lookup for later seqs.
  std::atomic<uint64_t> bad_max_{0};

  // Cold: the provenance tables, written only when something fails.
  struct bad_range {
    uint64_t last;
    failure_ptr cause;
  };
  // Stands in when a cause cannot be made (out of memory); made with the board.
  alignas(64) failure_ptr oom_cause_;
  mutable std::mutex bad_mu_;
  // Seqs that resolved failed or cancelled, as ranges keyed by their first
  // seq; guarded by bad_mu_.
  std::map<uint64_t, bad_range> bad_;
  // (last seq, cause) of each drop, oldest first; guarded by bad_mu_.
  std::deque<std::pair<uint64_t, failure_ptr>> drops_;

  // Waiters: guarded by waiters_mu_.
  mutable spin_mutex waiters_mu_;
  waiter_list waiters_;
  bool closed_ = false;
};

} // namespace multidev::detail
