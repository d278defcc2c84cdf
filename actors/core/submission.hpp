#pragma once
/// \file
/// A device's submission path: how work gets onto its queue. Tasks
/// (`push`), pool operations (`push_order`), waits on another device of
/// this process (`push_wait`) or on a reply (`push_gate`), each appended in
/// seq order under the queue's short lock, and the producers' backpressure
/// (`wait_for_room`, `has_room`, `notify_when_room`).
///
/// A base of `device_core`, with no state of its own: it appends to the
/// core's work queue, takes extras from its cache, registers gates in its
/// gate list and asks its life whether work is refused. A base rather than
/// a member or a view so that a push stays what it was: the callers'
/// `core.push(...)` is unchanged, and the core's address is `this`, cast
/// at compile time (`core()`), not loaded. Definitions: device_queue.cpp
/// (tasks, orders, backpressure), device_gates.cpp (waits).
///
/// Threads: every member, any thread. Only `push` with `may_wait` and
/// `wait_for_room` block, and never on a runner thread (of any device):
/// there they return at once and the queue grows past its capacity. Actor
/// handlers pass `may_wait = false` (a CAF worker must not block).
///
/// Invariants: seqs are handed out one at a time, in the order of the
/// queue's lock, and an item is appended whole or not at all (a push that
/// throws leaves nothing queued and allocates nothing it keeps); a gate is
/// in the gate list before its item is queued, so that `shutdown` either
/// collects it or the push is refused; work is refused (`device_error`)
/// once the device failed or stops.

#include <cstdint>
#include <functional>
#include <utility>
#include <memory>
#include <string>
#include <string_view>

#include "actors/core/gate.hpp"
#include "actors/core/item.hpp"
#include "multidev/task.hpp"
#include "multidev/trace.hpp"

namespace multidev::detail {

class device_core;

class work_submission {
public:
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
  /// reference to `g`. (`device_core::resolve_gate` opens or fails it.)
  void push_gate(const std::shared_ptr<gate>& g);

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

protected:
  work_submission() = default;
  ~work_submission() = default;

private:
  friend class bulk_push; // appends entries made the same way
  /// The core this is the base of (a cast, no load). Defined in
  /// device_core.hpp, where the core is complete.
  device_core& core() noexcept;
  const device_core& core() const noexcept;
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
  /// With the queue's lock held: a described task's extra, its text in the
  /// queue's `text` (`append_text`), or a `named_extra` when that has no
  /// room left to address it.
  static extra_ptr described_extra(std::string& text, std::string_view description,
                                   trace_kind kind);
  /// A wait's extra for `g`, from the core's cache (as an order's).
  std::unique_ptr<item_extra> wait_extra(std::shared_ptr<gate> g);
  /// An order's entry (`push_order`'s): its work, which runs `o` on the
  /// driver as `kind` says, and its extra from the core's cache, holding
  /// `hold`. The work points into the extra: they go in together.
  std::pair<std::function<void()>, std::unique_ptr<item_extra>>
  order_entry(const order& o, trace_kind kind, std::string_view label,
              std::shared_ptr<const void> hold);
};

} // namespace multidev::detail
