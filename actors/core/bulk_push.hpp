#pragma once
/// \file
/// A bulk push: the entries of one replay of a recorded round (round.hpp)
/// on several devices of this process, appended at once. Each device's
/// queue lock is taken once for the whole replay (not once per entry), and
/// all of them are held together, in address order, so that every entry's
/// seq is known before any entry is visible: a wait of one device on an
/// entry of another is built whole (its gate's owner and seq set) before
/// its runner can see it, however the round's devices alternate.
///
/// What a replay costs the host here, per entry: a task's closure moved
/// into its slot; a wait's gate (from the process-wide gate cache) and its
/// extra (from the device's `extra_cache`), registered with its owner. No
/// lock per entry: a lock per device for the queue, one for its gate list
/// when it has waits, and one per wait with its owner's waiters (where the
/// owner's runner may fire it at once).
///
/// Semantics, those of the calls it stands for (`push`, `push_wait`):
/// - All or nothing: when one device refuses work (failed, stopping), or
///   memory runs out, nothing of the push is queued on any device, and the
///   refusal is thrown (`device_error`, `std::bad_alloc`).
/// - Backpressure: it waits, before taking the locks, until every device
///   has room for one more entry (not on a runner thread, as `push`); a
///   replay's entries on a device then go in whole, so a queue may exceed
///   its capacity by one replay's entries there.
/// - A gate is in its device's gate list before its entry is visible, as
///   `push_gate` keeps it, so `shutdown` sees it or the push is refused.
///
/// Threads: any host thread; an object per thread (its buffers are
/// scratch, reused so that a push allocates nothing once they have grown).
/// Lock order: the queue locks in address order, then one device's waiter
/// lock at a time under them (nothing takes a queue lock under a waiter
/// lock).

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/core/gate.hpp"
#include "actors/core/item.hpp"
#include "multidev/task.hpp"

namespace multidev::detail {

class device_core;

/// One entry of a bulk push: a task, or a wait of its device (`lane`) on
/// an earlier step of another lane.
struct bulk_step {
  /// The index of its device in the push's lanes. (31 bits, beside
  /// `order_only`: a step stays 8 bytes, as a replay reads every one.)
  uint32_t lane : 31 = 0;
  /// A wait on a step of this push that is ordering only (`wait_kind::order`:
  /// a write after a read, the awaited item's failure does not carry).
  uint32_t order_only : 1 = 0;
  /// A wait: the index of the earlier step, on another lane, whose item it
  /// waits for (a data dependency: that item's failure fails this device,
  /// as `will_wait_for`'s). -1: a task. `external`: a wait on something
  /// else (an item of another node's part of the round), whose gate the
  /// caller makes and later opens or fails (`device_core::resolve_gate`).
  int32_t wait_on = -1;
  static constexpr int32_t external = -2;
};
static_assert(sizeof(bulk_step) == 8);

/// A task step's work and what names it (as `task`'s fields, the text
/// borrowed: it must outlive the push).
struct bulk_task {
  std::function<void()> work;
  std::string_view description;
  trace_kind kind = trace_kind::task;
  /// Released as the task resolves (a named task's pinned pools; an
  /// order's pool).
  std::shared_ptr<const void> keep_alive;
  /// An order step (a memset): `work` is ignored, the entry is the order's
  /// (`work_submission::order_entry`, of trace kind `kind`), as
  /// `push_order` makes it. Borrowed: it must outlive the push. (A pointer,
  /// not the order inline: a replay makes and drops a `bulk_task` per step,
  /// and 56 bytes more each cost `fan_dag_1dev_replay` a third.)
  const work_order* order = nullptr;
};

class bulk_push {
public:
  /// Appends `steps` in order, each on its lane's device: a task step
  /// moves `tasks[i]`'s work in, a wait step makes a gate. `ends[l]` gets
  /// lane `l`'s last seq once all are appended (its `all_work`): a lane's
  /// steps take consecutive seqs, so step `i`'s is its lane's last seq
  /// before the push plus its place among the lane's steps. `lanes`: distinct devices of this process. Throws as the
  /// type's comment says, with nothing queued.
  ///
  /// `external`: the gates of the `external` wait steps, in step order (made
  /// by the caller, `remote` and labelled; queued here, registered with no
  /// owner). `may_wait` false: no waiting for room (an actor's thread,
  /// which must not block); the queues may then exceed their capacity by
  /// the push.
  void push(std::span<device_core* const> lanes, std::span<const bulk_step> steps,
            std::span<bulk_task> tasks, std::span<uint64_t> ends,
            std::span<const std::shared_ptr<gate>> external = {}, bool may_wait = true);

private:
  /// Waits until each lane has room for one more (unless on a runner).
  static void wait_for_room(std::span<device_core* const> lanes);
  /// Takes the lanes' queue locks in address order (`order_`).
  void lock_all(std::span<device_core* const> lanes);
  void unlock_all(std::span<device_core* const> lanes) noexcept;

  // Scratch, reused from push to push.
  std::vector<uint32_t> order_;  // lane indexes, by the core's address
  std::vector<uint64_t> count_;  // entries appended per lane
  std::vector<uint64_t> seqs_;   // per step: its seq
  std::vector<uint8_t> wake_;    // lanes whose runner is rung at the end
  std::vector<extra_ptr> extra_; // per step: a task's named extra, a wait's
  std::vector<std::shared_ptr<gate>> gates_; // per step: a wait's gate
  std::vector<std::size_t> waits_;   // the wait steps, grouped by lane
  std::vector<std::size_t> wait_at_; // where each lane's start in waits_
  std::vector<std::size_t> fill_;    // cursors while grouping
};

} // namespace multidev::detail
