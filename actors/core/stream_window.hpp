#pragma once
/// \file
/// An asynchronous driver's flight window: the items of one device between
/// their start (submitted to the device's `stream`, or settled by the
/// runner: a wait, a dropped item) and their resolution, in `size()` slots
/// reused in seq order (`seq % size()`), and the rules by which they
/// resolve. The device (`owner`) resolves each one as the window tells it
/// to (done, failed or dropped); the window decides which, and when.
///
/// The stream reports items from its own thread, in any order. Items
/// resolve strictly in seq order: the thread that reports an item resolves
/// it and the settled ones behind it once those before it are resolved (so
/// the stream's next item finds it done); an item reported early waits in
/// its slot, and the runner resolves what it settles itself (waits, dropped
/// items).
///
/// Invariants:
/// - `retired() <= started()`, and `started() - retired() <= size()`: a slot
///   is reused only once the item that held it is resolved (the runner asks
///   `has_room` before `start`).
/// - Items resolve one at a time, in seq order, under the retire lock; each
///   one exactly once, through `owner::resolve_flight`.
/// - A slot's `state` leaves `flying` once (the stream's report) and
///   `gated` once (`settle_gated`, the runner); the other fields are
///   written before the store that publishes them (`started_` for the
///   runner's, `state` for the stream's).
/// - Once an item fails (its work threw, or a wait failed), every item
///   started before that failure was seen and after it resolves dropped,
///   even if it ran (`failed_behind_`); the stream skips the items behind a
///   failed one until it is resolved (`stream_failed_at_`).
///
/// Threads: `attach` before the runner starts; `closing`/`close` by the
/// thread that shuts the device down (`close` once the runner is joined).
/// `start`, `has_room`, `idle`, `settle_gated`, `take_reask`: the device's
/// runner only. The stream's thread runs the work `start` submitted and
/// reports through `sink()`. `retirable`, `retire_ready`, `resolve_settled`,
/// `ask_again`, the readers: any thread (`retire_ready` takes the retire
/// lock).
///
/// The window never blocks: it has no bell; `owner::window_changed` rings
/// the runner's.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>

#include "actors/core/item.hpp"
#include "actors/core/outcome_board.hpp"
#include "actors/core/spin.hpp"
#include "devices/driver.hpp"

namespace multidev::detail {

class device_core;
class trace_clock;

class stream_window : private completion_sink {
public:
  /// One item between its start and its resolution.
  struct flight {
    enum kind_t : uint8_t { task, gate, dropped };
    /// `gated`: a gate the driver ordered on the device (`order_after`),
    /// settled once the gate itself opens or fails.
    enum state_t : uint8_t { flying, ran, threw, skipped, gated };
    item it;
    uint64_t seq = 0;
    kind_t kind = task;
    // Written on the stream, read by the runner once `state` says so.
    bool skipped_on_stream = false;
    bool threw_on_stream = false;
    bool began_on_stream = false; // its work was taken up (trace times)
    std::exception_ptr error;
    /// Trace times (when tracing is on): the start is when the runner
    /// submitted it, or parked on it for a gate, until the stream takes it
    /// up; the end is when the stream reported it. An item the stream
    /// reported without taking it up (a device fault) spans no time.
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    /// `flying` until the stream reports it (the runner sets the others
    /// itself for items it does not submit).
    std::atomic<uint8_t> state{flying};
  };

  /// How a settled item resolves.
  enum class verdict : uint8_t {
    /// Its work ran (a task), or the wait opened (a gate).
    done,
    /// Its work threw, or the driver refused it (`f.error`), or the wait
    /// failed (a gate): the device fails at its seq.
    failed,
    /// Not run, or run but never done: cancelled, killed, behind a
    /// failure, skipped on the stream.
    dropped,
  };

  /// The device the window belongs to (device_core, privately; a test's
  /// stand-in). Called under the window's retire lock or from the stream's
  /// thread; neither may throw nor block.
  class owner {
  public:
    /// Resolves `f` (item `f.it`, seq `f.seq`, trace times `f.start_ns`,
    /// `f.end_ns`) as `v`: one at a time, in seq order, each seq once. The
    /// item may be moved from or reset; the window resets it afterwards.
    virtual void resolve_flight(flight& f, verdict v) noexcept = 0;
    /// The window has room again, or holds items to resolve: wake the
    /// runner if it sleeps.
    virtual void window_changed() noexcept = 0;

  protected:
    ~owner() = default;
  };

  /// `outcomes`: the device's (what is dropped, how far it resolved); its
  /// owner resolves into it. `clock`: the trace's, null with tracing off.
  /// `device`: the device whose items these are (`current_runner` on the
  /// stream while it runs one; may be null in tests).
  stream_window(owner& o, const outcome_board& outcomes, const trace_clock* clock,
                const device_core* device) noexcept
    : owner_(o), outcomes_(outcomes), clock_(clock), device_(device) {}
  stream_window(const stream_window&) = delete;
  stream_window& operator=(const stream_window&) = delete;
  /// Destroys the stream first (it waits for its reports), then the slots.
  ~stream_window() { close(); }

  // -- Set-up and shutdown -------------------------------------------------------

  /// What to pass the driver's `open_stream`: reports go to the window.
  completion_sink& sink() noexcept { return *this; }
  /// Takes the stream the driver opened (null: a synchronous driver; the
  /// window stays empty) and makes `max_in_flight` slots (at least 1).
  void attach(std::unique_ptr<stream> s, std::size_t max_in_flight);
  /// Whether the device has a stream (an asynchronous driver).
  bool async() const noexcept { return stream_ != nullptr; }
  /// The device shuts down: the stream bounds what stays in flight.
  void closing() {
    if (stream_)
      stream_->closing();
  }
  /// Destroys the stream, which waits for every report (the runner has
  /// resolved everything it submitted).
  void close() noexcept { stream_.reset(); }

  // -- The runner ------------------------------------------------------------------

  /// The last seq placed in the window.
  uint64_t started() const noexcept { return started_.load(std::memory_order_relaxed); }
  /// Whether another item may start: a slot is free, and the items up to
  /// `barrier` (a failed wait: nothing behind it starts before it
  /// resolves) are resolved.
  bool has_room(uint64_t barrier) const noexcept {
    auto retired = retired_.load(std::memory_order_seq_cst);
    return started_.load(std::memory_order_relaxed) - retired < size_ && retired >= barrier;
  }
  /// Whether everything started is resolved.
  bool idle() const noexcept {
    return started_.load(std::memory_order_relaxed) == retired_.load(std::memory_order_seq_cst);
  }
  /// Places `it` as the next seq (`started() + 1`) and submits its work to
  /// the stream, unless it is a gate (which the runner saw end, or ordered
  /// on the device: `gate_on_device`) or dropped, or has no work. A
  /// description in a batch's text must have been moved into the item.
  /// `parked_ns`: for a gate, when the runner began waiting on it (trace;
  /// 0: now). A submission the stream refuses fails the item.
  void start(item&& it, int64_t parked_ns, bool gate_on_device);
  /// Settles the oldest unresolved item when it is a gate ordered on the
  /// device that has ended (or was dropped); whether it did.
  bool settle_gated() noexcept;
  /// Whether the driver asked, since the last call, for the gate the runner
  /// waits at to be ordered on the device again (`ask_again`).
  bool take_reask() noexcept { return reask_.exchange(false, std::memory_order_seq_cst); }

  // -- Any thread ------------------------------------------------------------------

  /// Whether the oldest item in the window is settled (reported by the
  /// stream, or settled by the runner) and not yet resolved.
  bool retirable() const noexcept;
  /// Resolves the settled items at the head of the window, in seq order.
  /// Called by the runner, and by the stream as it reports (so an item is
  /// done before the stream runs the next one); one at a time.
  void retire_ready() noexcept;
  /// The runner's part for the items already started, once: settles the
  /// gates ordered on the device that ended and resolves what is ready.
  /// Whether it resolved anything.
  bool resolve_settled() noexcept;
  /// The driver's `wake` after a gate's producer submitted more: the runner
  /// asks again whether it can order the gate on the device (the caller
  /// then rings it).
  void ask_again() noexcept { reask_.store(true, std::memory_order_seq_cst); }
  /// The last seq resolved, its slot free.
  uint64_t retired() const noexcept { return retired_.load(std::memory_order_acquire); }
  /// Slots (the most items in flight).
  std::size_t size() const noexcept { return size_; }

private:
  /// On the stream: runs the item's work, unless it was dropped since it
  /// was submitted or an item before it just failed there.
  void run_on_stream(flight& f);
  /// The stream reports an item (completion_sink).
  void completed(uint64_t seq, std::exception_ptr error) noexcept override;
  /// Resolves one settled item through the owner. Call with retire_mu_ held.
  void retire(flight& f) noexcept;

  owner& owner_;
  const outcome_board& outcomes_;
  const trace_clock* clock_;
  const device_core* device_;
  // The window holds the items between start and resolution, `seq % size_`.
  std::size_t size_ = 1;
  std::unique_ptr<flight[]> flights_;
  // The last seq placed in the window; written by the runner once the slot
  // is filled.
  std::atomic<uint64_t> started_{0};
  // Resolving items: one thread at a time, in seq order.
  spin_mutex retire_mu_;
  std::atomic<uint64_t> retired_{0}; // the last seq resolved and its slot freed
  uint64_t failed_behind_ = 0; // guarded by retire_mu_: items up to here ran behind a failure
  // The last item whose work threw on the stream: the stream skips the items
  // behind it until the runner has resolved it (and dropped them).
  alignas(64) std::atomic<uint64_t> stream_failed_at_{0};
  // Set (and the runner rung) when a gate's producer submitted more, so the
  // runner asks `stream_runner::order_on_device` again.
  std::atomic<bool> reask_{false};
  // Destroyed before the slots its completions touch (and, as a member of
  // the device, before what the owner's resolutions touch, after the runner).
  std::unique_ptr<stream> stream_;
};

// Inline: the runner's loop polls these while it spins (`stream_runner::run`).

inline bool stream_window::settle_gated() noexcept {
  // Only the runner reads a gated flight's gate: nothing retires it (or
  // frees the gate) while it is `gated`.
  auto r = retired_.load(std::memory_order_acquire);
  if (r >= started_.load(std::memory_order_relaxed))
    return false;
  auto& f = flights_[(r + 1) % size_];
  if (f.state.load(std::memory_order_seq_cst) != flight::gated)
    return false;
  auto gs = f.it.as_gate()->state.load(std::memory_order_seq_cst);
  if (gs != gate::open && gs != gate::failed &&
      f.seq > outcomes_.dropped_upto(std::memory_order_seq_cst))
    return false;
  f.state.store(flight::ran, std::memory_order_seq_cst);
  return true;
}

inline bool stream_window::retirable() const noexcept {
  auto r = retired_.load(std::memory_order_acquire);
  if (r >= started_.load(std::memory_order_seq_cst))
    return false;
  auto st = flights_[(r + 1) % size_].state.load(std::memory_order_seq_cst);
  return st != flight::flying && st != flight::gated;
}

} // namespace multidev::detail
