#pragma once
/// \file
/// The runner trace: what each device's runner did, item by item, with start
/// and end times. Off by default (`backend_options::trace_capacity`); when on,
/// each runner keeps its last records in a ring of fixed size, which
/// `backend::trace` copies out without stopping the runner. The scenario runner
/// turns the records into Chrome traces and logical traces. No CAF.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "multidev/sexp.hpp"

namespace multidev {

/// What a runner item was.
enum class trace_kind : uint8_t {
  task,   ///< A closure or a named kernel.
  copy,   ///< A transfer: from_host, to_host, device_to_device.
  memset, ///< memset_zero.
  pool,   ///< A pool change ordered with the work: a freed or replaced pool released.
  gate,   ///< A wait for another device's event (will_wait_for).
  cancel, ///< An item the runner dropped instead of running it.
};

/// The name as printed in sexps and traces (e.g. `"memset"`).
std::string to_string(trace_kind k);

/// Parses a name printed by `to_string`; `std::nullopt` when unknown.
std::optional<trace_kind> trace_kind_from_string(const std::string& s);

/// The name as an atom.
sexp to_sexp(trace_kind k);

/// Nanoseconds of the trace clock, one monotonic clock for every device and
/// thread of the process, in which host code can time its own events beside
/// the records. It is `std::chrono::steady_clock` since its epoch, or, on
/// x86-64 with an invariant time-stamp counter, that counter scaled to agree
/// with it (calibrated once, a few ms on first use; the same rate within
/// ~0.01%), which is cheaper to read per item.
int64_t trace_clock_ns() noexcept;

/// One item a runner handled.
struct trace_record {
  /// The item's place in its device's schedule (its event's seq).
  uint64_t seq = 0;
  /// What the item was.
  trace_kind kind = trace_kind::task;
  /// The task's description; `task#<seq>` for a nameless closure;
  /// `wait for <device> seq <n>` for a gate.
  std::string description;
  /// When the runner took the item up and when its event was done
  /// (`trace_clock_ns`); a gate's span is the time the runner waited.
  int64_t start_ns = 0;
  /// When its event was done (`trace_clock_ns`).
  int64_t end_ns = 0;
  /// Whether the item failed (the task threw, the awaited event failed);
  /// the device failed with it.
  bool failed = false;
  /// A gate's awaited event: the owner's name (`"<backend>:<ordinal>:<id>"`,
  /// or a label for a device behind an actor) and its seq. Empty and 0 for
  /// the other kinds.
  std::string awaited_device;
  /// A gate's awaited seq; 0 for the other kinds.
  uint64_t awaited_seq = 0;

  /// Member-wise equality.
  friend bool operator==(const trace_record&, const trace_record&) = default;
};

/// `(item (seq 3) (kind task) (description task#3) (start_ns ..) (end_ns ..))`,
/// plus `(failed true)` when it failed and `(awaits (device ..) (seq ..))`
/// for a gate.
sexp to_sexp(const trace_record& r);

/// A copy of one device's trace, taken without stopping its runner.
struct device_trace {
  /// The device's name.
  std::string device;
  /// The ring's size; 0 when tracing is off.
  std::size_t capacity = 0;
  /// The records still held, oldest first, in seq order.
  std::vector<trace_record> records;
  /// Records written before the oldest one here and overwritten since.
  uint64_t dropped = 0;
};

/// `(trace (device ..) (capacity ..) (dropped ..) (records (item ..) ...))`.
sexp to_sexp(const device_trace& t);

} // namespace multidev
