#pragma once
/// \file
/// The runner of a device on an asynchronous driver (one with a stream):
/// submits the device's items to the stream and moves on, without waiting
/// for them, at most the window's size at a time (`stream_window`); the
/// stream reports each one later, from its own thread, in any order, and
/// the window resolves them strictly in seq order (calling back
/// `device_core::resolve_flight`). The runner starts an item only when the
/// window has room, and otherwise sleeps until a completion rings. Waits
/// on other devices (gates) stay on the runner: it starts nothing behind a
/// gate until the gate opens (or the driver ordered it on the device:
/// `order_on_device`), while the items before it keep completing. Pool
/// releases, memsets and copies are queue items like any other, so they go
/// through the stream in order. No hand-over: an asynchronous driver's
/// items run on its stream, so its token stays with its runner.
///
/// Invariants:
/// - `batch_[next_]` is the next item to start, seq `window.started() + 1`;
///   the items before it have been started (moved into the window).
/// - `barrier_`: after a failed wait, nothing behind it starts before it
///   resolves (`stream_window::has_room`).
/// - `parked_` is the gate the device is parked at (`gate_list::parked_on`)
///   or null; `on_device_` the gate at `next_` the driver ordered on the
///   device, `asked_` the last one the runner asked it about.
///
/// Threads: one object lives on the runner thread's stack for the thread's
/// life (`device_runner::run`); nothing else touches it.
/// `serve_started_until` runs on that thread too, inside a task's sync.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "actors/core/item.hpp"

namespace multidev::detail {

class device_core;
class device_runner;

class stream_runner {
public:
  /// The submission loop of `runner`'s device; `run` returns once it stops.
  explicit stream_runner(device_runner& runner) noexcept;
  /// Submits and resolves until the device stops with nothing in flight.
  void run();
  /// On `core`'s runner thread, inside an item's work, on an asynchronous
  /// driver that runs that work on the runner (the CUDA driver launches an
  /// item's work as it submits it): a task that syncs on an earlier item of
  /// its own device blocks the runner, and the runner alone settles the
  /// waits the driver ordered on the device (`gated`), so an item behind
  /// such a wait would never resolve. Until `flag` is non-zero or
  /// `deadline` passes, does the runner's part for the items already
  /// started (settles those waits as they end, resolves what is ready:
  /// `stream_window::resolve_settled`), sleeping on the bell in between.
  /// Whether `flag` became non-zero.
  static bool serve_started_until(device_core& core, const std::atomic<uint32_t>& flag,
                                  std::chrono::steady_clock::time_point deadline) noexcept;

private:
  /// A wait ends when the awaited event resolves, or when it is dropped.
  bool ended(const gate& g) const noexcept;
  /// Whether the window has room and an item is ready to start (the next
  /// one is no pending gate, or one the driver ordered on the device), or
  /// the queue has more to take.
  bool startable();
  /// Nothing in flight, nothing taken (the stream may have resolved the
  /// last items while the runner looked elsewhere).
  bool idle() const noexcept;
  /// Records `g` (or none) as the gate the device is parked at.
  void park(const gate* g) noexcept;
  /// Starts `batch_[next_]`, taking the next batch first when this one is spent.
  void start_next();
  /// Whether the driver ordered this device's stream behind `g`'s event on
  /// the hardware (a wait between two streams of one driver), so the runner
  /// may go on past `g` without waiting for it. When it may later, the
  /// driver's wake makes the window ask again (`stream_window::take_reask`).
  bool order_on_device(const gate& g);

  device_runner& runner_;
  device_core& core_;
  std::vector<item> batch_;
  std::size_t next_ = 0; // batch_[next_]: the next item to start
  uint64_t barrier_ = 0; // a failed wait: nothing behind it starts before it resolves
  const gate* parked_ = nullptr;
  int64_t parked_ns_ = 0; // when the runner began waiting on `parked_` (trace)
  // A gate the driver ordered on the device (asked when the runner reaches
  // it, and again whenever the producer submitted more: take_reask).
  const gate* on_device_ = nullptr;
  const gate* asked_ = nullptr;
};

} // namespace multidev::detail
