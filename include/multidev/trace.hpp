#pragma once
/// \file
/// The runner trace: what each device's runner did, item by item, with start
/// and end times, and what this process's host threads saw of the device
/// (their blocking waits on it, the loss of its node). Off by default
/// (`backend_options::trace_capacity`, or the `MULTIDEV_TRACE` environment
/// variable); when on, each runner keeps its last records in a ring of fixed
/// size, which `backend::trace` copies out without stopping the runner.
/// `make_timeline` turns the traces into a timeline, which
/// `chrome_trace_json` and `timeline_svg` draw; `write_chrome_trace` and
/// `write_timeline_svg` do it all for a backend. No CAF.

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "multidev/fwd.hpp"
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

/// What a `host_span` was.
enum class host_span_kind : uint8_t {
  wait,      ///< A host thread blocked in `sync` or `await` on the device's work.
  node_lost, ///< The device's node was lost: from when it was last heard to when it was declared lost.
};

/// `"wait"` or `"node_lost"`.
std::string to_string(host_span_kind k);

/// Something this process saw of a device from outside its runner, recorded
/// with tracing on (`backend_options::trace_capacity` of the backend that
/// made or attached the device; the last that many are kept).
///
/// A wait: a thread that is no device's runner (a host thread, an actor's
/// handler) blocked in `sync` or `await` on the device's work, from when it
/// began to block to when it returned or threw. A call that did not block
/// (the work was done) records nothing.
///
/// A node loss: the device lives in another process, and this process
/// declared its node lost (its actor went down: a connection that broke, or
/// one silent for longer than CAF's `middleman.connection-timeout`). The
/// span runs from when this process last heard from the device, as far as
/// it can tell, to when it declared the loss. "Last heard" is the device's
/// last reply, but no earlier than the connection timeout plus one
/// `middleman.heartbeat-interval` before the loss: CAF drops a node at a
/// heartbeat tick once nothing, heartbeats included, was heard from it for
/// the timeout. For a node cut off while in use the span is the time its
/// loss took to be found; a killed node, whose connection closes, is found
/// at once, and its span is as long as it had been idle. A device whose
/// actor stopped (its backend was destroyed) gets a span of no length at
/// the moment its link learned it.
struct host_span {
  /// A host thread's wait, or a node's loss.
  host_span_kind kind = host_span_kind::wait;
  /// `sync seq 3`, `await seq 7`; `node lost: <why>`.
  std::string description;
  /// A wait's thread: 1, 2, ... in the order this process's threads first
  /// blocked with tracing on; 0 for a node loss.
  uint64_t thread = 0;
  /// The seq waited for (an `await`: everything scheduled up to it); 0 for
  /// a node loss.
  uint64_t seq = 0;
  /// When the span began, a `trace_clock_ns` time.
  int64_t start_ns = 0;
  /// When it ended, a `trace_clock_ns` time.
  int64_t end_ns = 0;
  /// A wait that ended in an error (a failed or cancelled event, a
  /// deadline, a lost node); always true for a node loss.
  bool failed = false;

  /// Field by field.
  friend bool operator==(const host_span&, const host_span&) = default;
};

/// `(host_span (kind wait) (description ..) (thread ..) (seq ..) (start_ns ..)
/// (end_ns ..))`, plus `(failed true)` when it failed.
sexp to_sexp(const host_span& s);

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
  /// What this process saw of the device from outside (`host_span`),
  /// oldest first by start. Kept by the process that asks: not sent between
  /// processes.
  std::vector<host_span> host;
  /// For a device of another process whose node is lost, why: its records
  /// can no longer be read (`records` is empty), `host` still holds what
  /// this process saw. Empty otherwise.
  std::string unreachable;
};

/// `(trace (device ..) (capacity ..) (dropped ..) (records (item ..) ...))`,
/// plus `(host (host_span ..) ...)` when there are host spans and
/// `(unreachable ..)` when the records could not be read.
sexp to_sexp(const device_trace& t);

// -- Timelines --------------------------------------------------------------

/// One slice of a timeline: an item a runner handled, a host thread's wait,
/// a node's loss, or (in `multidev run`) a blocking step of the script.
struct timeline_slice {
  /// Index into `timeline::lanes`.
  int lane = 0;
  /// What the slice shows: the item's description, the wait, the loss.
  std::string name;
  /// A `trace_kind`'s name (`task`, `copy`, `memset`, `pool`, `gate`,
  /// `cancel`), `host` (a host thread's wait, or a script's step) or `lost`
  /// (a node loss).
  std::string kind;
  /// When it began, a `trace_clock_ns` time.
  int64_t start_ns = 0;
  /// When it ended, a `trace_clock_ns` time.
  int64_t end_ns = 0;
  /// Whether the item or wait failed (always true for a loss).
  bool failed = false;
  /// The item's seq on its device; for a wait, the seq waited for; 0 for a
  /// loss.
  uint64_t seq = 0;
  /// A name for the item's event (`multidev run`: the script's `(as NAME)`).
  std::string event;
};

/// A dependency arrow: `from_slice` finished before `to_slice` could go on.
struct timeline_flow {
  /// The lane the arrow leaves (index into `timeline::lanes`).
  int from_lane = 0;
  /// Where it leaves: the end of `from_slice`.
  int64_t from_ns = 0;
  /// The lane the arrow reaches.
  int to_lane = 0;
  /// Where it arrives: the start of `to_slice`.
  int64_t to_ns = 0;
  /// `wait` (a gate, a host thread's wait), or what a script's edge was.
  std::string kind;
  /// The slice the arrow leaves (index into `timeline::slices`).
  std::size_t from_slice = 0;
  /// The slice it reaches (index into `timeline::slices`).
  std::size_t to_slice = 0;
};

/// What `chrome_trace_json` and `timeline_svg` draw: lanes (a device each,
/// then host threads), slices, arrows. Times are `trace_clock_ns()`.
struct timeline {
  /// The heading (the SVG's title, the Chrome trace's process name).
  std::string title;
  /// Name and value pairs for the Chrome trace's `otherData`.
  std::vector<std::pair<std::string, std::string>> info;
  /// Lane names, top to bottom: the devices, then the host threads.
  std::vector<std::string> lanes;
  /// Every slice, on any lane.
  std::vector<timeline_slice> slices;
  /// Every dependency arrow.
  std::vector<timeline_flow> flows;
  /// The span drawn: from the earliest slice to the latest, unless set
  /// otherwise.
  int64_t start_ns = 0;
  /// The end of the span drawn (see `start_ns`).
  int64_t end_ns = 0;
};

/// The timeline of `traces`: lane `i` is `device i (<traces[i].device>)`,
/// with a slice per record (named by its description) and one per node
/// loss (kind `lost`); an arrow from each awaited item to the gate that
/// waited for it (when the awaited device is one of `traces`). With
/// `host_waits`, a lane per host thread after the devices' (`host thread
/// N`), with a slice per wait (kind `host`) and an arrow from the item it
/// waited for.
timeline make_timeline(const std::vector<device_trace>& traces, bool host_waits = true);

/// The timeline of `b`'s devices: the ones its `get_device` returned so far,
/// local and attached (in ordinal order), then the devices attached to it
/// otherwise (lanes `attached (<name>)`); each device's `backend::trace`,
/// host waits included. A device of another process is asked by message;
/// its records are timed by its own process's trace clock (steady-clock
/// nanoseconds: aligned on one machine, not across machines). Throws
/// `std::invalid_argument` when tracing is off for `b`
/// (`backend_options::trace_capacity` is 0 and `MULTIDEV_TRACE` is unset).
timeline make_timeline(const backend& b);

/// Chrome trace-event JSON (opens in https://ui.perfetto.dev and
/// chrome://tracing): a thread per lane, a complete event (`X`) per slice
/// with its kind as category and `seq`, `kind`, `event`, `failed` as args,
/// and a flow (`s`/`f` pair, category `dependency`) per arrow.
std::string chrome_trace_json(const timeline& tl);

/// A self-contained SVG Gantt chart of the timeline: a lane per device and
/// host thread, slices coloured by kind, an arrow per dependency, a time
/// axis and a legend; no script, no external resource.
std::string timeline_svg(const timeline& tl);

/// `chrome_trace_json(make_timeline(b))`, written to `out` or to the file at
/// `path` (replaced). Throws `std::invalid_argument` when tracing is off for
/// `b`, and `std::runtime_error` naming the path and the reason when the
/// file cannot be written.
void write_chrome_trace(const backend& b, std::ostream& out);
/// `write_chrome_trace` into the file at `path` (replaced).
void write_chrome_trace(const backend& b, const std::string& path);

/// `timeline_svg(make_timeline(b))`, as `write_chrome_trace`.
void write_timeline_svg(const backend& b, std::ostream& out);
/// `write_timeline_svg` into the file at `path` (replaced).
void write_timeline_svg(const backend& b, const std::string& path);

} // namespace multidev
