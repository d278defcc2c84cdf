#pragma once
/// \file
/// Recorded rounds (issue 41): a step's schedule captured once with
/// `backend::record` and run again with `backend::replay`, the way a training
/// loop schedules the same kernels, waits and copies every step (CUDA
/// Graphs' capture, Legion's tracing, Taskflow's build-once taskflow).
///
/// While `backend::record(body)` runs `body` on the calling thread, the
/// backend's work calls made on that thread (`schedule_task`,
/// `schedule_named`, `schedule_batch`, `will_wait_for`, `run`,
/// `device_to_device`, `memset_zero`, `alloc_pool`, `free_pool`) are not
/// run: each becomes an item of the round, in call order. The events they
/// return inside the body are *recorded events*: they name an item of the
/// round (not a point of any device's schedule), so a `will_wait_for` on one
/// waits, at each replay, for that replay's item. They cannot be synced.
/// docs/api.md ("Recorded rounds") lists what is refused inside a record.
///
/// A round whose items all run in this process is replayed on the
/// devices: its entries pushed at once, with one queue lock per device, and
/// its events made on demand; any other round (and a remapped replay) goes
/// through the backend's own per-call path (docs/design.md, "Recorded
/// rounds").
///
/// Threads: a round is a handle (copies share one recording); replaying it
/// from several threads at once is safe, changing its slots (`arg`) while
/// another thread replays it is not.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "multidev/device.hpp"
#include "multidev/event.hpp"
#include "multidev/sexp.hpp"
#include "multidev/task.hpp"

namespace multidev {

namespace detail {
struct round_state;   // actors/round_state.hpp
struct replay_access; // actors/round.cpp
struct node_replay;   // actors/round_state.hpp
} // namespace detail

/// A scalar argument of a recorded named task (`schedule_named` or one spec
/// of `schedule_batch`) that replays may change: see `round::slot`.
struct round_slot {
  /// The item's index in the round.
  std::size_t item = std::numeric_limits<std::size_t>::max();
  /// The argument's index in the item's `task_spec::args`.
  std::size_t arg = 0;
  /// Member-wise equality.
  friend bool operator==(const round_slot&, const round_slot&) = default;
};

/// What one replay scheduled: one event per recorded item, in record order,
/// and the `all_work` of every device the round touches, taken once every
/// item of the replay was scheduled.
///
/// Lazy: a replay on the devices (a round whose items all run in this
/// process) hands back the round and each device's last seq, and an item's
/// event is made when asked (its seq is the device's base plus the item's
/// place there), so a replay does not build an event per item.
class replay_events {
public:
  replay_events() = default;

  /// How many items (the round's size).
  std::size_t size() const noexcept;
  /// Item `i`'s event in this replay. A task, named task, `run`, copy or
  /// `memset_zero`: its own completion. A `will_wait_for`, `alloc_pool` or
  /// `free_pool`: its device's `all_work` right after it was scheduled.
  /// Throws `std::invalid_argument` when `i >= size()`.
  event item(std::size_t i) const;
  /// Every item's event, in record order (made on the call).
  std::vector<event> items() const;
  /// This replay's event of the item that `recorded` (an event returned
  /// inside the `record` body) names. Throws `std::invalid_argument` for
  /// an event that is not one of this round's recorded events.
  event of(const event& recorded) const;
  /// Every device the round touches, in the order the round first touched
  /// them, with its `all_work` after this replay's items.
  std::vector<std::pair<device, event>> all_work() const;
  /// This replay's `all_work` of `d`. Throws `std::invalid_argument` when
  /// the round does not touch `d`.
  event all_work_of(const device& d) const;

private:
  friend class backend;
  friend struct detail::replay_access;
  /// The round's id, to check `of`'s argument.
  uint32_t round_id_ = 0;
  /// A replay call by call: the events as its calls returned them.
  std::vector<event> items_;
  std::vector<std::pair<device, event>> all_work_;
  /// A replay on the devices: the round (its plan) and each of its
  /// devices' last seq once the replay was pushed (`replay_plan`).
  std::shared_ptr<const detail::round_state> st_;
  std::vector<uint64_t> ends_;
  /// The same inline, for up to 8 devices (then `ends_` is empty): a
  /// replay allocates no events.
  std::array<uint64_t, 8> few_ends_{};
  uint64_t end_of(std::size_t lane) const noexcept {
    return ends_.empty() ? few_ends_[lane] : ends_[lane];
  }
  /// A replay on nodes: their replies, which `item` and `all_work` wait for.
  std::shared_ptr<const detail::node_replay> nodes_;
};

/// Where `backend::replay(r, remap)` moves a round: each pair is
/// (device the round was recorded on, device its items run on instead).
/// Devices the round touches that are not a pair's first stay.
using device_remap = std::vector<std::pair<device, device>>;

/// A recorded round: the items `backend::record` captured, replayed by
/// `backend::replay`. Default-constructed: empty, and `replay` refuses it.
class round {
public:
  round() = default;
  /// A handle of `st` (internal; `backend::record` makes rounds).
  explicit round(std::shared_ptr<detail::round_state> st) : state_(std::move(st)) {}

  /// The name given to `record` (`"round <id>"` when none was).
  const std::string& name() const;
  /// How many items it holds.
  std::size_t size() const;
  /// How many times it was replayed so far (the next replay is number
  /// `replays() + 1` in failure texts).
  uint64_t replays() const;
  /// Item `i`'s name, as failure texts give it (`"scale 3"`: what it is and
  /// its index, or the name given with `name_item`).
  const std::string& item_name(std::size_t i) const;
  /// The index of the item `recorded` names (an event returned inside the
  /// `record` body). Throws `std::invalid_argument` for another event.
  std::size_t index_of(const event& recorded) const;
  /// Names the item `recorded` names, for failure texts ("replay 412 of
  /// round 'step', item 'grad 3'").
  void name_item(const event& recorded, std::string name);

  /// Marks argument `arg` of the named task whose recorded event is
  /// `recorded` as a slot, which replays read anew. Throws
  /// `std::invalid_argument` when the item is not a named task, or `arg` is
  /// out of range or a buffer.
  round_slot slot(const event& recorded, std::size_t arg);

  /// A slot's value, assignable: `r.arg(s) = 0.01`. An assignment of a kind
  /// the kernel does not take there throws `std::invalid_argument` (an int
  /// is accepted for a float) and keeps the old value.
  class arg_ref {
  public:
    /// Sets a float argument.
    arg_ref& operator=(double v);
    /// Sets an int argument (or a float one).
    arg_ref& operator=(int64_t v);
    /// Sets an int argument (or a float one).
    arg_ref& operator=(int v) { return *this = static_cast<int64_t>(v); }
    /// Sets a string argument.
    arg_ref& operator=(std::string v);
    /// The current value.
    const kernel_arg& value() const;

  private:
    friend class round;
    arg_ref(detail::round_state& st, round_slot s) : st_(&st), s_(s) {}
    arg_ref& set(kernel_arg v);
    detail::round_state* st_;
    round_slot s_;
  };
  /// The slot's value, for reading or assigning. Throws
  /// `std::invalid_argument` for a slot of another round or one not marked.
  arg_ref arg(round_slot s);
  /// The slot's current value.
  const kernel_arg& arg(round_slot s) const;

  /// `(round (name ..) (replays ..) (items (item (index ..) (name ..)
  /// (device ..)) ...))`.
  sexp describe() const;

  /// Whether this holds a recording.
  explicit operator bool() const noexcept { return state_ != nullptr; }
  /// The recording (internal).
  const std::shared_ptr<detail::round_state>& state() const noexcept { return state_; }

private:
  detail::round_state& st() const;
  std::shared_ptr<detail::round_state> state_;
};

} // namespace multidev
