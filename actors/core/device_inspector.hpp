#pragma once
/// \file
/// What a device's state looks like from outside, for debug info, the wait
/// graph, deadline messages and `backend::trace`: a read-only view that
/// changes nothing, so that the core's own interface is what its work
/// needs.
///
/// Invariants: a reader changes nothing. It reads each part under that
/// part's own lock (the waiter lock for the gates and waiters, the queue's
/// for the error), one at a time, and copies the trace without stopping
/// the runner (trace.hpp). A gate is named only through the gate list,
/// which keeps it alive (the runner may pass and free the one it was
/// parked at meanwhile).
///
/// Threads: any thread. A view, made by `device_core::inspect()`; it holds
/// no state of its own and must not outlive the core.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "multidev/sexp.hpp"
#include "multidev/trace.hpp"

namespace multidev::detail {

class device_core;
class extra_cache;
class gate_list;
class device_events;
class trace_ring;
struct gate;

class device_inspector {
public:
  /// The core's parts that the public interface does not show: its gates,
  /// who waits for its seqs, its extras' cache and its trace
  /// (null when tracing is off).
  device_inspector(const device_core& core, const gate_list& gates,
                   const device_events& events, const extra_cache& extras,
                   const trace_ring* trace) noexcept
    : core_(core), gates_(gates), events_(events), extras_(extras), trace_(trace) {}

  /// Queue, progress, waits, error and pools.
  sexp debug_info() const;
  /// The gates queued here, not opened and not yet passed by the runner
  /// (pending, or failed and still ahead), in the order they were queued (a
  /// gate being queued has seq 0); `parked`, if given, is set
  /// to the one the runner is parked on (null when none). For the wait graph.
  std::vector<std::shared_ptr<gate>> pending_gates(const gate** parked = nullptr) const;
  /// A copy of the runner trace, taken without stopping the runner, with
  /// the host threads' blocking waits on this device (`host_span`); empty,
  /// with capacity 0, when tracing is off.
  device_trace trace() const;
  /// The description of the task at `seq` while the runner runs it, when
  /// the trace is on and the task has one (a described task); empty
  /// otherwise (a deadline's chain).
  std::string running_description(uint64_t seq) const;
  /// Whether everything scheduled is finished and the device has not failed.
  bool is_idle() const noexcept;

private:
  const device_core& core_;
  const gate_list& gates_;
  const device_events& events_;
  const extra_cache& extras_;
  const trace_ring* trace_;
};

} // namespace multidev::detail
