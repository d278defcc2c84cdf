#pragma once
/// \file
/// The state a device actor owns: its runner (FIFO queue + thread), its event
/// bookkeeping and its pool table. The hot path (scheduling, finishing tasks,
/// resolving local waits) runs here without CAF messages, as SPEC §1 asks:
/// a producer appends under a short lock and rings the runner only when it
/// sleeps; a finished item advances an atomic progress word and fires the
/// waiters registered for it. The device actor (`device_actor.cpp`) drives
/// the control plane and cross-process waits through the same object.
///
/// Threads: `push*`, `when_done`, `sync` and the readers are safe from any
/// thread. One thread at a time executes items (or, on an asynchronous
/// driver, submits them to the device's stream) and resolves them: the
/// runner, or on a synchronous driver whichever runner holds the device's
/// token (`device_runner`, "hand-over"); "runner only" below means that thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "actors/core/device_runner.hpp"
#include "actors/core/exec_token.hpp"
#include "actors/core/extra_cache.hpp"
#include "actors/core/gate.hpp"
#include "actors/core/gate_list.hpp"
#include "actors/core/gate_waiters.hpp"
#include "actors/core/item.hpp"
#include "actors/core/lease.hpp"
#include "actors/core/outcome_board.hpp"
#include "actors/core/pool_table.hpp"
#include "actors/core/result_board.hpp"
#include "actors/core/spin.hpp"
#include "actors/core/stream_runner.hpp"
#include "actors/core/stream_window.hpp"
#include "actors/core/work_queue.hpp"
#include "devices/driver.hpp"
#include "multidev/backend.hpp"
#include "multidev/task.hpp"

namespace multidev::detail {

class device_core;
class trace_ring;

/// The device whose runner this thread is, if any (set by the runner thread,
/// and by an asynchronous driver's stream thread while it runs that device's
/// work).
inline thread_local const device_core* current_runner = nullptr;
/// The device whose own runner thread this is, for the thread's life (unlike
/// `current_runner`, not switched while it runs another device's items): a
/// device outlives its runner thread, so this thread may use it without a
/// reference.
inline thread_local device_core* home_runner = nullptr;
/// On an asynchronous driver's stream: the seq of the item it runs (a task
/// may sync on the device's earlier items, not on this one or later ones).
inline thread_local uint64_t current_item = 0;

/// The state a device actor owns. Pieces with their own state and rules:
/// `outcome_board` (what became of each seq, and who is told),
/// `pool_table` (pool ids to memory), `trace_ring` (the trace, when on),
/// `stream_window` (an asynchronous driver's items in flight),
/// `device_runner` (the runner thread and the hand-over: device_runner.hpp).
/// Its members are defined by job: device_core.cpp (life: start, stop,
/// shutdown), device_queue.cpp (the producer side and backpressure),
/// device_runner.cpp (resolving items, beside the runner's definitions),
/// device_gates.cpp (waits for other
/// devices), device_events.cpp (waiters and syncs over the outcome board),
/// device_pools.cpp (pool operations ordered with the work),
/// device_debug.cpp, device_trace.cpp (the runner trace).
class device_core : public std::enable_shared_from_this<device_core>,
                    private stream_window::owner {
public:
  /// Why an event did not complete; shared by every event it resolves.
  using failure_ptr = outcome_board::failure_ptr;
  /// Called once an awaited seq is resolved: `cause == nullptr` when done,
  /// otherwise why it failed or was cancelled. Runs on whichever thread
  /// resolves it; must not block.
  using resolver = outcome_board::resolver;
  /// The same with the cause rendered (`describe()`), for callers that only
  /// pass a message on (`error == nullptr`: done).
  using waiter = std::function<void(const std::string* error)>;

  /// `trace_capacity`: records the runner trace keeps (0: no trace).
  /// `max_in_flight`: on an asynchronous driver, how many items may be
  /// submitted to the device's stream and not yet resolved (at least 1).
  device_core(std::string name, int ordinal, std::shared_ptr<driver> drv,
              std::size_t queue_capacity, std::shared_ptr<result_board> results,
              std::size_t trace_capacity = 0, std::size_t max_in_flight = 64,
              bool hand_over = true, bool pin_runner = false);
  /// Drains and joins (see `shutdown`).
  ~device_core();

  const std::string& name() const noexcept { return name_; }
  int ordinal() const noexcept { return ordinal_; }
  driver& drv() const noexcept { return *driver_; }
  result_board& results() const noexcept { return *results_; }

  // -- The pieces, for what they answer on their own ---------------------------

  using work_queue_t = work_queue<item>;
  /// What became of each seq: `finished()`, `is_done(seq)` (once true, true
  /// forever, for every observer), `is_failed`, `state`, `cause_of`. Any thread.
  const outcome_board& outcomes() const noexcept { return outcomes_; }
  /// The queue: `scheduled()` (the last seq scheduled), whether the runner
  /// sleeps (`sleeping()`), how often its doorbell rang (`rings()`). Any thread.
  const work_queue_t& queue() const noexcept { return queue_; }
  /// The pools as of the end of the queue: `find(id)`, `span(...)`,
  /// `used_memory()`. Any thread.
  const pool_table& pools() const noexcept { return pools_; }
  /// Who may run this device's items (`state_name()`), and the hand-over's
  /// counters (`run_by_others()`, `deferred_wakes()`). Any thread.
  const exec_token& token() const noexcept { return runner_.token(); }
  /// The runner: `running_item()`, `runner_cpu()`, `ring_if_deferred`,
  /// `ring_deferred`, `wake_runner`, the tests' `hold_after_wake` (see
  /// device_runner.hpp for which thread may call what).
  device_runner& runner() noexcept { return runner_; }
  const device_runner& runner() const noexcept { return runner_; }

  // -- Work ------------------------------------------------------------------

  /// Appends a task; returns its seq. When the queue is full and `may_wait`,
  /// waits for room, unless called from a runner thread (of any device).
  /// Actor handlers pass false: a CAF worker must not block. Throws
  /// `device_error` when failed or shut down.
  uint64_t push(task&& t, bool may_wait = true);
  /// Work on one of this device's pools, named only when asked (see
  /// `work_order` in item.hpp).
  using order = work_order;
  /// Appends `o` as an item of trace kind `kind`, holding `hold` (the pool)
  /// until it is done; never waits for room. What it does follows from
  /// `kind`: `copy` copies, `memset` zeroes, `pool` does nothing (it releases
  /// `hold` in its turn). `label` names a node (`order::node`). Allocates
  /// nothing once the runner has handed back an item of a label as long
  /// (see `extra_cache`). Throws like `push`.
  uint64_t push_order(const order& o, trace_kind kind, std::string_view label,
                      std::shared_ptr<const void> hold);
  /// Appends a wait on `owner`'s `seq` (a local will_wait_for). No-op when the
  /// event is done or `owner` is this device, and for `wait_kind::order` when
  /// it is resolved in any way; returns whether a gate was added. A
  /// `wait_kind::order` gate opens when `seq` fails or is cancelled too.
  /// Never waits for room (a wait is one small entry). Throws
  /// `std::invalid_argument` when `owner` never scheduled `seq`.
  bool push_wait(const std::shared_ptr<device_core>& owner, uint64_t seq,
                 wait_kind kind = wait_kind::data);
  /// Appends a gate that someone else opens or fails (`g.remote`: a CAF reply
  /// opens it); never waits for room. Gates still pending when this device
  /// shuts down are failed if their owner is remote, gone, or not shutting
  /// down itself, since their answer may never come; gates on owners that
  /// are draining too open as those drain. The queue entry takes its own
  /// reference to `g`.
  void push_gate(const std::shared_ptr<gate>& g);
  /// Opens (`cause == nullptr`) or fails a gate pushed here (the first
  /// resolution wins), and wakes the runner. Never throws.
  void resolve_gate(gate& g, const failure_ptr& cause) noexcept;
  /// The same with a message only (a CAF error's rendering): the cause is a
  /// failure of the gate's owner with that message.
  void resolve_gate(gate& g, const std::string* error) noexcept;

  /// Waits until the queue has room (or the device failed or is stopping);
  /// returns at once on any runner thread, like `push`. Reserves nothing.
  void wait_for_room();
  /// Whether the queue has room for another entry without waiting (or the
  /// device failed or is stopping, so that a push fails at once).
  bool has_room() const noexcept;
  /// Flow control for producers that must not block (the device actor):
  /// returns false when `has_room()`; otherwise stores `cb` (replacing an
  /// earlier one) and returns true, and the runner calls `cb` once, on its
  /// thread, when it next makes room, fails or stops. `cb` must not block.
  bool notify_when_room(std::function<void()> cb);

  /// Throws `std::invalid_argument` when `seq` was never scheduled here.
  void check_scheduled(uint64_t seq, const char* what) const;
  bool is_idle() const noexcept {
    return outcomes_.finished() == queue_.scheduled() && !failed();
  }
  /// The description of the task at `seq` while the runner runs it, when
  /// the trace is on and the task has one (a described task); empty
  /// otherwise. Any thread (a deadline's chain).
  std::string running_description(uint64_t seq) const;
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

  // -- Failure, cancellation, recovery ----------------------------------------

  /// Drops the work queued and not yet started: those items resolve
  /// cancelled, in seq order, as the runner reaches them (a running task is
  /// not interrupted; a runner parked on a wait leaves it). The device stays
  /// usable. Returns the last seq cancelled (0 when there was nothing).
  uint64_t cancel(std::string why = {});
  /// Makes the device a session's (actors/remote/node.cpp): its runner starts an
  /// item only while `*deadline` (steady-clock nanoseconds) is in the
  /// future; past it, it stores 0 there (the lease is over for good: a
  /// renewal is refused) and cancels everything not started, saying `why`.
  /// Call it before any work is scheduled. A device without a lease (every
  /// ordinary backend's) pays one branch on a null pointer per item.
  void set_lease(std::shared_ptr<std::atomic<int64_t>> deadline, std::string why);
  /// Kills the device: the work not yet started fails with `reason`, no new
  /// work is accepted, the runner stops once it has resolved what it held.
  void kill(std::string reason);
  /// Brings a failed device back: events that failed stay failed, pools
  /// survive, new work runs. False when the device had not failed (or was
  /// killed or shut down: those do not come back).
  bool recover();
  /// Whether the device is failed now (refusing work until `recover`).
  bool failed() const noexcept { return failed_flag_.load(std::memory_order_acquire); }
  /// Throws the `device_error` new work would get when the device is failed
  /// (or killed); returns otherwise. For `await` on a device whose last item
  /// finished before it failed.
  void throw_if_failed() const;

  /// The failure message, if the device failed.
  std::optional<std::string> error() const;
  /// A waiter's error without the leading `"<this device's name>: "`, so the
  /// name is said once when the error is wrapped again.
  std::string reason_of(std::string_view error) const;
  /// Throws `device_error` if the device failed.
  void check() const;
  /// Stops accepting work and cancels remote waits; does not wait.
  void request_stop();
  /// Whether `request_stop` or `shutdown` was called.
  bool stopping() const;
  /// Fails the pending waits that may never be answered once this device
  /// stops: remote ones, and local ones whose owner is gone or not stopping.
  /// `shutdown` calls it; a backend calls it on all its devices, after asking
  /// them all to stop and before joining any, so a chain of waits that leaves
  /// the backend anywhere is cut.
  void cancel_unanswerable_waits();
  /// Fails the pending remote waits (the actor that would have opened them
  /// is gone) with `why`.
  void cancel_remote_waits(const std::string& why);
  /// Stops accepting work, cancels the waits that may never be answered (see
  /// `push_gate`), finishes what was accepted, joins the runner. Waits still
  /// pending afterwards resolve as failed. Idempotent.
  void shutdown();

  // -- Pools (called by the device actor) -------------------------------------

  void alloc_pool(int id, std::size_t size, std::size_t alignment,
                  std::optional<memory_mode> mode);
  void free_pool(int id);
  uint64_t memset_zero(int id, std::size_t offset, std::size_t size);
  /// Copies `bytes` into pool `id` at `offset`, ordered with the work (a
  /// transfer from another process); returns its seq. Never waits for room.
  uint64_t write_bytes(int id, std::size_t offset, std::shared_ptr<const std::string> bytes);
  /// Copies `out->size()` bytes of pool `id` at `offset` into `*out`,
  /// ordered with the work; returns its seq (`*out` is filled once it is
  /// done). Never waits for room.
  uint64_t read_bytes(int id, std::size_t offset, std::shared_ptr<std::string> out);

  /// Queue, progress, waits, error and pools.
  sexp debug_info() const;
  /// The gates queued here, not opened and not yet passed by the runner
  /// (pending, or failed and still ahead), in the order they were queued (a
  /// gate being queued has seq 0); `parked`, if given, is set
  /// to the one the runner is parked on (null when none). For the wait graph.
  std::vector<std::shared_ptr<gate>> pending_gates(const gate** parked = nullptr) const;

  // -- Trace (device_trace.cpp) -------------------------------------------------

  /// A copy of the runner trace, taken without stopping the runner, with
  /// the host threads' blocking waits on this device (`host_span`); empty,
  /// with capacity 0, when tracing is off. Any thread.
  device_trace trace() const;

private:
  /// The runner executes and resolves items with the pieces above and the
  /// resolving functions below (`complete`, `drop`, `poison`, ...).
  friend class device_runner;
  friend class stream_runner;
  /// Appends the wait `g` (see push_gate) as an item of its own; never waits
  /// for room. Returns its seq.
  uint64_t enqueue_wait(std::shared_ptr<gate> g);
  /// Appends an item built in its queue slot from `work` and the extra
  /// `make_extra(text)` returns (`text`: the queue's, see `append_text`),
  /// called with the queue's lock held; returns its seq.
  template <class MakeExtra>
  uint64_t enqueue(std::function<void()>&& work, MakeExtra&& make_extra, bool may_wait);
  /// With the queue's lock held: appends `description` to the queue's
  /// `text`; its place there, or null (no room left to address it: the
  /// caller makes a `named_extra`).
  static extra_ptr append_text(std::string& text, std::string_view description,
                               trace_kind kind);
  /// Throws `refusal_locked()`. Call with the queue's lock held.
  [[noreturn, gnu::noinline, gnu::cold]] void throw_refusal_locked() const;
  /// The error a push gets from a failed, killed or stopped device. Call
  /// with the queue's lock held.
  device_error refusal_locked() const;
  void release_later(std::shared_ptr<pool> old, const char* what);
  /// The window resolves an item (stream_window::owner): under its retire
  /// lock, in seq order, on the runner or the thread the stream reports on.
  void resolve_flight(stream_window::flight& f, stream_window::verdict v) noexcept override;
  /// The window has room or items to resolve (stream_window::owner): rings
  /// the runner.
  void window_changed() noexcept override { ring(); }
  /// Why a task failed, from what it threw.
  failure_ptr task_failure(const item& it, uint64_t seq, std::exception_ptr e) const;
  /// Why a wait failed: the awaited event's cause, with this wait in front
  /// of its path.
  failure_ptr gate_failure(const gate& g) const;
  /// The task's description as given, or built for an order; empty for a
  /// bare closure and a gate. A description in the batch's text is read
  /// from the runner's batch (`item_batch::text_of`): `it` is in it (the token holder's).
  std::string description_of(const item& it) const;
  /// Resolving (`complete`, `resolve_bad`, `poison`, `drop`: "runner only"
  /// below) is one thread at a time, in seq order: the runner, or on an
  /// asynchronous driver whoever holds the window's retire lock (the runner,
  /// or the thread on which the stream reports).
  void complete(uint64_t seq);
  /// Runner only: resolves `seq` as failed (or cancelled) with `cause`.
  void resolve_bad(uint64_t seq, failure_ptr cause) noexcept;
  /// Runner only: `seq` failed with the cause `make()` returns (a fixed text
  /// when that throws). The device fails: it refuses new work until
  /// `recover`, and the items queued behind `seq` fail with the same cause
  /// as the runner reaches them. Never throws.
  template <class MakeCause>
  void poison(uint64_t seq, MakeCause make) noexcept;
  /// Runner only: resolves an item that `cancel`, `kill` or a failure
  /// dropped, with the cause in force for it.
  void drop(item& it, uint64_t seq) noexcept;
  /// Drops everything scheduled so far that is not yet dropped, with
  /// `cause`. Call with the queue's lock held; no-op when nothing new is
  /// scheduled.
  void drop_locked(const failure_ptr& cause) noexcept {
    outcomes_.drop_through(queue_.scheduled(std::memory_order_relaxed), cause);
  }
  /// Fires the waiters of seqs up to `upto` with their outcomes; with
  /// `beyond`, also the waiters of seqs not resolved, with that cause (at
  /// shutdown). Never throws.
  void fire(uint64_t upto, const failure* beyond = nullptr) noexcept;
  /// A failure of this device itself (no task): killed, shut down.
  failure_ptr device_failure(std::string message) const;
  /// Fails the pending gates `which` selects, with `why`.
  void cancel_gates(bool (*which)(const gate&), const std::string& why);
  /// Wakes the runner if it sleeps.
  void ring() noexcept { queue_.ring(); }

  std::string name_;
  int ordinal_;
  std::shared_ptr<driver> driver_;
  std::shared_ptr<result_board> results_;

  // The fields are grouped by who writes them on the hot path, one cache
  // line apart, so a producer pushing and a runner finishing items do not
  // move each other's lines back and forth.

  // Producer side: the queue, its backpressure and the runner's doorbell.
  // Its lock also guards killed_, error_ and drops_ below.
  work_queue_t queue_;
  bool killed_ = false; // guarded by queue_'s lock

  // What became of each seq, and who is told (its own lines: the runner
  // writes its first as it resolves items). Drops are made under the
  // queue's lock.
  outcome_board outcomes_;
  // Runner side (the runner's own fields: `runner_`, last).
  alignas(64) std::atomic<bool> failed_flag_{false}; // mirrors queue_.failed_locked()
  // The runner's records and host threads' blocking waits on this device;
  // null when tracing is off; set once, at construction.
  std::unique_ptr<trace_ring> trace_;

  // Orders' and waits' extras for reuse (see extra_cache.hpp): producers
  // take them, the runner hands them back as it takes a batch. Two lines of
  // their own (the class is 64-aligned), kept off the hot lines above:
  // tasks that are neither orders nor waits never touch them.
  extra_cache extras_;

  // Cold: errors, backpressure, waiters, pools.
  alignas(64) failure_ptr error_;   // guarded by queue_'s lock: why the device failed
  /// Local waits of other devices on this one's seqs, registered without a
  /// resolver (see gate_waiters.hpp); guarded by the waiter lock
  /// (`outcomes_.waiters_mutex()`), whose minimum covers them.
  gate_waiters gate_waiters_;
  /// Registers `w` with this (owner) device, or resolves it at once as
  /// `when_resolved` would call a resolver. Moves from `w` only once it is
  /// stored: when this throws (out of memory), `w` is as it was.
  void when_resolved(gate_waiter&& w);
  /// Both `when_resolved`s: `enter()` under the waiter lock while `seq` is
  /// pending, else `resolve(cause)` at once (null cause: done).
  template <class Enter, class Resolve>
  void when_resolved_as(uint64_t seq, Enter&& enter, Resolve&& resolve);
  // The gates queued here, pending or passed (counted), and the one the
  // device is parked at. Guarded by the waiter lock (outcomes_.waiters_mutex();
  // see gate_list).
  gate_list gates_;

  // Pools: the table as of the end of the queue (its lock on a line of its
  // own, away from what the runner reads).
  pool_table pools_;

  // Asynchronous drivers (no stream: the synchronous path): the items
  // between start and resolution, and the stream. Destroyed before the
  // members its completions touch, after the runner.
  stream_window window_;

  // A session's lease (`set_lease`; see lease.hpp); none for a device
  // without one. Checked by the runner before each item.
  session_lease lease_;
  /// Before an item starts: cancels the queue once the lease is over (one
  /// branch on a null pointer without a lease).
  void check_lease() noexcept {
    if (lease_.over()) [[unlikely]]
      cancel_past_lease();
  }
  /// The lease is over: cancels what is scheduled and not yet dropped,
  /// saying `lease_.why()`.
  [[gnu::cold]] void cancel_past_lease() noexcept;
  // The runner thread, its batch and the hand-over (device_runner.hpp):
  // last, so that it goes first (its thread is joined by then).
  device_runner runner_{*this};
};

// The runner's inline members that read its core (complete only here).

inline uint64_t device_runner::running_item() const noexcept {
  return core_.window_.async() ? current_item : executed_;
}

inline void device_runner::wake_runner() noexcept {
  core_.ring();
}

} // namespace multidev::detail
