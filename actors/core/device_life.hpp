#pragma once
/// \file
/// A device's life and failure state: whether it accepts work, why it
/// refuses it, and the transitions between. Without it these fields lived
/// among the queue's and the runner's, and every part of the core could
/// flip them; here they change only through the transitions below.
///
/// States (the queue's refusal flags, `work_queue::refuse_locked`, plus
/// `killed_`):
///
/// | state    | accepts work | leaves by                   | to       |
/// |----------|--------------|-----------------------------|----------|
/// | running  | yes          | `fail_locked` (a poison)    | failed   |
/// |          |              | `kill`                      | killed   |
/// |          |              | `request_stop`              | stopping |
/// | failed   | no           | `recover`                   | running  |
/// |          |              | `kill`, `request_stop`      | killed, stopping |
/// | killed   | no, for good | (none: `recover` is false)  |          |
/// | stopping | no, for good | `kill` while work is left   | killed   |
///
/// `cancel` and a lease that runs out (`check_lease`) change no state: they
/// drop what is scheduled and not started (`outcome_board::drop_through`).
///
/// Invariants:
/// - `failed()` (an atomic mirror, read without the lock) equals the queue's
///   `failed_locked()` after every transition: both change under the queue's
///   lock, in one step.
/// - `error_` is set while failed or killed (the first cause: a kill keeps
///   it; a poison of a killed device leaves it), and reset by `recover`.
/// - A killed or stopping device never accepts work again.
///
/// Threads: every function is safe from any thread, except `check_lease`
/// (the thread that starts the device's items: its runner) and the
/// `*_locked` ones (with the queue's lock held). `set_lease` before any
/// work is scheduled.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "actors/core/item.hpp"
#include "actors/core/lease.hpp"
#include "actors/core/outcome_board.hpp"
#include "actors/core/work_queue.hpp"
#include "multidev/types.hpp"

namespace multidev::detail {

struct gate;
class gate_list;

class device_life {
public:
  using failure_ptr = outcome_board::failure_ptr;

  /// The device's parts it changes: its name (said in errors), its queue
  /// (whose lock guards the state), what became of its seqs, and its gates
  /// (the waits cancelled as it stops). All outlive this object.
  device_life(const std::string& name, work_queue<item>& queue, outcome_board& outcomes,
              gate_list& gates) noexcept
    : name_(name), queue_(queue), outcomes_(outcomes), gates_(gates) {}
  device_life(const device_life&) = delete;
  device_life& operator=(const device_life&) = delete;

  // -- Transitions ---------------------------------------------------------------

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
  void set_lease(std::shared_ptr<std::atomic<int64_t>> deadline, std::string why) {
    lease_.set(std::move(deadline), std::move(why));
  }
  /// Kills the device: the work not yet started fails with `reason`, no new
  /// work is accepted, the runner stops once it has resolved what it held.
  void kill(std::string reason);
  /// Brings a failed device back: events that failed stay failed, pools
  /// survive, new work runs. False when the device had not failed (or was
  /// killed or shut down: those do not come back).
  bool recover();
  /// Stops accepting work and cancels remote waits; does not wait.
  void request_stop();
  /// Runner only, with the queue's lock held (a poison): the device fails
  /// with `cause` and refuses new work until `recover`; a killed device
  /// stays as it is. Wakes the producers waiting for room.
  void fail_locked(const failure_ptr& cause) noexcept {
    if (killed_)
      return;
    queue_.refuse_locked(false, true);
    failed_flag_.store(true, std::memory_order_release);
    error_ = cause;
  }
  /// Drops everything scheduled so far that is not yet dropped, with
  /// `cause`. Call with the queue's lock held; no-op when nothing new is
  /// scheduled.
  void drop_locked(const failure_ptr& cause) noexcept {
    outcomes_.drop_through(queue_.scheduled(std::memory_order_relaxed), cause);
  }
  /// Before an item starts (the runner): cancels the queue once the lease
  /// is over (one branch on a null pointer without a lease).
  void check_lease() noexcept {
    if (lease_.over()) [[unlikely]]
      cancel_past_lease();
  }

  // -- Waits that may never be answered ----------------------------------------------

  /// Fails the pending waits that may never be answered once this device
  /// stops: remote ones, and local ones whose owner is gone or not stopping.
  /// `device_core::shutdown` calls it; a backend calls it on all its devices,
  /// after asking them all to stop and before joining any, so a chain of
  /// waits that leaves the backend anywhere is cut.
  void cancel_unanswerable_waits();
  /// Fails the pending remote waits (the actor that would have opened them
  /// is gone) with `why`.
  void cancel_remote_waits(const std::string& why);

  // -- Readers ---------------------------------------------------------------------

  /// Whether the device is failed now (refusing work until `recover`).
  bool failed() const noexcept { return failed_flag_.load(std::memory_order_acquire); }
  /// Whether `request_stop` (or the core's `shutdown`) was called.
  bool stopping() const;
  /// Throws the `device_error` new work would get when the device is failed
  /// (or killed); returns otherwise. For `await` on a device whose last item
  /// finished before it failed.
  void throw_if_failed() const;
  /// Throws `device_error` if the device failed.
  void check() const;
  /// The failure message, if the device failed.
  std::optional<std::string> error() const;
  /// A waiter's error without the leading `"<this device's name>: "`, so the
  /// name is said once when the error is wrapped again.
  std::string reason_of(std::string_view error) const;
  /// A failure of this device itself (no task): killed, shut down.
  failure_ptr device_failure(std::string message) const;
  /// Throws the error a push gets from a failed, killed or stopped device.
  /// Call with the queue's lock held.
  [[noreturn, gnu::noinline, gnu::cold]] void throw_refusal_locked() const;

private:
  /// The error a push gets from a failed, killed or stopped device. Call
  /// with the queue's lock held.
  device_error refusal_locked() const;
  /// The lease is over: cancels what is scheduled and not yet dropped,
  /// saying `lease_.why()`.
  [[gnu::cold]] void cancel_past_lease() noexcept;
  /// Fails the pending gates `which` selects, with `why`.
  void cancel_gates(bool (*which)(const gate&), const std::string& why);

  const std::string& name_;
  work_queue<item>& queue_;
  outcome_board& outcomes_;
  gate_list& gates_;

  std::atomic<bool> failed_flag_{false}; // mirrors queue_.failed_locked()
  bool killed_ = false;                  // guarded by queue_'s lock
  failure_ptr error_;                    // guarded by queue_'s lock: why the device failed
  // A session's lease (`set_lease`; see lease.hpp); none for a device
  // without one. Checked by the runner before each item.
  session_lease lease_;
};

} // namespace multidev::detail
