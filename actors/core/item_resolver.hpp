#pragma once
/// \file
/// A device's resolving side: what becomes of each item once it ran, was
/// dropped or failed. `complete` publishes a done seq and fires its
/// waiters; `poison` fails the device at a seq (the items behind it fail
/// with the same cause); `drop` resolves an item that a cancel, a kill or a
/// failure dropped; `resolve_flight` resolves an asynchronous driver's item
/// as its window settles it; and the failure causes and descriptions they
/// record (`task_failure`, `gate_failure`, `description_of`).
///
/// A view of the core (`device_core::resolving()`), holding nothing but the
/// core's address: it owns no state of its own, and drives the core's
/// outcome board, events, trace, life and extras. Made on each call and
/// inlined there, it costs what calling the core did. Definitions:
/// device_runner.cpp, beside the item loop that inlines them.
///
/// Threads: resolving is one thread at a time, in seq order: the token
/// holder of a synchronous driver (the runner, or a runner serving the
/// device: hand_over.hpp), or on an asynchronous driver whoever holds the
/// window's retire lock (the runner, or the thread on which the stream
/// reports). `description_of` reads the batch's text: the token holder's.
///
/// Invariants: each seq is resolved once, in order (`outcome_board::publish`
/// advances the progress word by one); a poisoned device's queued items are
/// dropped under the queue's lock before `resolve_bad` publishes the
/// failure, so that nothing is accepted behind it unresolved.

#include <cstdint>
#include <exception>
#include <string>

#include "actors/core/outcome_board.hpp"
#include "actors/core/stream_window.hpp"

namespace multidev::detail {

class device_core;
struct gate;
struct item;

class item_resolver {
public:
  using failure_ptr = outcome_board::failure_ptr;

  explicit item_resolver(device_core& core) noexcept : core_(core) {}

  /// `seq` is done: published, its waiters fired (with the trace on, its
  /// record ends first, so whoever syncs sees it).
  void complete(uint64_t seq);
  /// Resolves `seq` as failed (or cancelled) with `cause`.
  void resolve_bad(uint64_t seq, failure_ptr cause) noexcept;
  /// `seq` failed with the cause `make()` returns (a fixed text when that
  /// throws). The device fails: it refuses new work until `recover`, and
  /// the items queued behind `seq` fail with the same cause as the runner
  /// reaches them. Never throws.
  template <class MakeCause>
  void poison(uint64_t seq, MakeCause make) noexcept;
  /// Resolves an item that `cancel`, `kill` or a failure dropped, with the
  /// cause in force for it.
  void drop(item& it, uint64_t seq) noexcept;
  /// An asynchronous driver's item, settled by its window (done, failed or
  /// dropped): resolved as such (`stream_window::owner`, through the core).
  void resolve_flight(stream_window::flight& f, stream_window::verdict v) noexcept;

  /// Why a task failed, from what it threw.
  failure_ptr task_failure(const item& it, uint64_t seq, std::exception_ptr e) const;
  /// Why a wait failed: the awaited event's cause, with this wait in front
  /// of its path.
  failure_ptr gate_failure(const gate& g) const;
  /// The task's description as given, or built for an order; empty for a
  /// bare closure and a gate. A description in the batch's text is read
  /// from the runner's batch (`item_batch::text_of`): `it` is in it.
  std::string description_of(const item& it) const;

private:
  device_core& core_;
};

} // namespace multidev::detail
