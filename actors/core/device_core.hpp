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

#include "actors/core/device_events.hpp"
#include "actors/core/device_inspector.hpp"
#include "actors/core/device_life.hpp"
#include "actors/core/device_memory.hpp"
#include "actors/core/device_runner.hpp"
#include "actors/core/exec_token.hpp"
#include "actors/core/extra_cache.hpp"
#include "actors/core/gate.hpp"
#include "actors/core/gate_list.hpp"
#include "actors/core/gate_waiters.hpp"
#include "actors/core/item.hpp"
#include "actors/core/item_resolver.hpp"
#include "actors/core/outcome_board.hpp"
#include "actors/core/pool_table.hpp"
#include "actors/core/result_board.hpp"
#include "actors/core/spin.hpp"
#include "actors/core/stream_runner.hpp"
#include "actors/core/stream_window.hpp"
#include "actors/core/submission.hpp"
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
/// `device_runner` (the runner thread: device_runner.hpp) and its
/// `hand_over` (the token and the protocol around it: hand_over.hpp),
/// `item_resolver` (the resolving side, a view: item_resolver.hpp),
/// `work_submission` (the submission path and its backpressure, a base:
/// submission.hpp).
/// Its faces, one per job, reached through an accessor: `runner()`
/// (device_runner), `life()` (device_life: the failure state and its
/// transitions), `events()` (device_events: waiters and syncs), `memory()`
/// (device_memory: pool operations ordered with the work), `inspect()`
/// (device_inspector: debug info, pending gates, trace).
/// Definitions by job: device_core.cpp (start, shutdown; the life's
/// transitions), device_queue.cpp (the submission path and backpressure),
/// device_runner.cpp (resolving items, beside the runner's and the
/// hand-over's definitions),
/// device_gates.cpp (waits for other devices), device_events.cpp (waiters
/// and syncs over the outcome board),
/// device_pools.cpp (pool operations ordered with the work),
/// device_debug.cpp, device_trace.cpp (the runner trace).
class device_core : public std::enable_shared_from_this<device_core>,
                    public work_submission,
                    private stream_window::owner {
  // Reads the trace (a host thread's wait) and the window (a task's sync
  // on an asynchronous driver's runner thread); asks the runner's hand-over
  // as it fires (`runner().handover().try_claim`, `try_defer`).
  friend class device_events;

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
  /// The runner: `running_item()`, `runner_cpu()`, `wake_runner`, and its
  /// `handover()` (hand_over.hpp: the token, `ring_if_deferred`,
  /// `ring_deferred`, the tests' `hold_after_wake`); device_runner.hpp says
  /// which thread may call what.
  device_runner& runner() noexcept { return runner_; }
  const device_runner& runner() const noexcept { return runner_; }

  // -- Work ------------------------------------------------------------------

  // Appending work (`push`, `push_order`, `push_wait`, `push_gate`) and its
  // backpressure (`wait_for_room`, `has_room`, `notify_when_room`) are the
  // submission path's: the base `work_submission` (submission.hpp).

  /// Opens (`cause == nullptr`) or fails a gate pushed here (the first
  /// resolution wins), and wakes the runner. Never throws.
  void resolve_gate(gate& g, const failure_ptr& cause) noexcept;
  /// The same with a message only (a CAF error's rendering): the cause is a
  /// failure of the gate's owner with that message.
  void resolve_gate(gate& g, const std::string* error) noexcept;

  // -- Waiters and syncs ------------------------------------------------------

  /// Who waits for this device's seqs, and the blocking syncs
  /// (device_events.hpp): `sync`, `sync_until`, `when_resolved`,
  /// `when_done`, `drop_waiter(s)`. Any thread.
  device_events& events() noexcept { return events_; }

  // -- Failure, cancellation, recovery ----------------------------------------

  /// The device's life and failure state (device_life.hpp): `cancel`,
  /// `kill`, `recover`, `request_stop`, `set_lease`; `failed()`, `error()`,
  /// `check()`, `stopping()`. Any thread.
  device_life& life() noexcept { return life_; }
  const device_life& life() const noexcept { return life_; }
  /// Stops accepting work, cancels the waits that may never be answered (see
  /// `push_gate`, `device_life::cancel_unanswerable_waits`), finishes what
  /// was accepted, joins the runner. Waits still pending afterwards resolve
  /// as failed. Idempotent.
  void shutdown();

  // -- Pools (called by the device actor) -------------------------------------

  /// The pool operations ordered with the work (device_memory.hpp):
  /// `alloc_pool`, `free_pool`, `memset_zero`, `write_bytes`, `read_bytes`.
  /// Any thread.
  device_memory memory() noexcept { return {*this, pools_}; }

  // -- Inspection ----------------------------------------------------------------

  /// What the state looks like from outside (device_inspector.hpp):
  /// `debug_info`, `pending_gates`, `trace`, `running_description`,
  /// `is_idle`. Any thread.
  device_inspector inspect() const noexcept {
    return {*this, gates_, events_, extras_, trace_.get()};
  }

private:
  /// The runner executes and resolves items with the pieces above and the
  /// resolving side (`resolving()`: `complete`, `drop`, `poison`, ...).
  friend class device_runner;
  friend class hand_over;
  friend class item_resolver;
  friend class work_submission;
  friend class bulk_push; // a replay's entries on several devices at once
  friend class stream_runner;
  /// The window resolves an item (stream_window::owner): under its retire
  /// lock, in seq order, on the runner or the thread the stream reports on.
  void resolve_flight(stream_window::flight& f, stream_window::verdict v) noexcept override;
  /// The window has room or items to resolve (stream_window::owner): rings
  /// the runner.
  void window_changed() noexcept override { queue_.ring(); }
  /// The resolving side (item_resolver.hpp: `complete`, `poison`,
  /// `drop`, ...): one thread at a time, in seq order (the token holder, or
  /// the window's retire-lock holder). A view: made and inlined per call.
  item_resolver resolving() noexcept { return item_resolver{*this}; }

  std::string name_;
  int ordinal_;
  std::shared_ptr<driver> driver_;
  std::shared_ptr<result_board> results_;

  // The fields are grouped by who writes them on the hot path, one cache
  // line apart, so a producer pushing and a runner finishing items do not
  // move each other's lines back and forth.

  // Producer side: the queue, its backpressure and the runner's doorbell.
  // Its lock also guards the life's state (life_ below) and drops.
  work_queue_t queue_;

  // What became of each seq, and who is told (its own lines: the runner
  // writes its first as it resolves items). Drops are made under the
  // queue's lock.
  outcome_board outcomes_;
  // Runner side (the runner's own fields: `runner_`, last). The runner's
  // records and host threads' blocking waits on this device; null when
  // tracing is off; set once, at construction.
  alignas(64) std::unique_ptr<trace_ring> trace_;

  // Orders' and waits' extras for reuse (see extra_cache.hpp): producers
  // take them, the runner hands them back as it takes a batch. Two lines of
  // their own (the class is 64-aligned), kept off the hot lines above:
  // tasks that are neither orders nor waits never touch them.
  extra_cache extras_;

  // Cold: the life and failure state (read-mostly: written only as the
  // device fails, recovers, is killed or stops), waiters, pools.
  alignas(64) device_life life_;
  // Who waits for this device's seqs (the waiter lock guards them).
  device_events events_;
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

  // The runner thread, its batch and the hand-over (device_runner.hpp):
  // last, so that it goes first (its thread is joined by then).
  device_runner runner_{*this};
};

// The runner's inline members that read its core (complete only here).

inline uint64_t device_runner::running_item() const noexcept {
  return core_.window_.async() ? current_item : executed_;
}

inline void device_runner::wake_runner() noexcept {
  core_.queue_.ring();
}

inline device_core& work_submission::core() noexcept {
  return static_cast<device_core&>(*this);
}

inline const device_core& work_submission::core() const noexcept {
  return static_cast<const device_core&>(*this);
}

inline device_runner& hand_over::runner() const noexcept {
  return core_.runner_;
}

inline bool device_inspector::is_idle() const noexcept {
  return core_.outcomes().finished() == core_.queue().scheduled() && !core_.life().failed();
}

} // namespace multidev::detail
