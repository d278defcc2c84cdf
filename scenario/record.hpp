#pragma once
// What a run leaves behind for the outputs: the devices' runner traces, the
// host's blocking steps, and the script's own model of the schedule (items
// per device in script order, and the edges between them), which is what
// the logical trace prints. Internal to scenario/.

#include <cstdint>
#include <string>
#include <vector>

#include <multidev/sexp.hpp>
#include <multidev/trace.hpp>

#include "scenario/scenario.hpp"

namespace multidev::scenario {

struct step;

/// An item the script put on a device.
struct model_item {
  /// Its seq in the device's schedule; 0 when the runtime queued nothing
  /// (a wait on an event already done).
  uint64_t seq = 0;
  std::string kind;
  std::string description;
  /// The script's name for its event, if any.
  std::string event;
  location where;
  /// Its place among all items of the run, in script order.
  uint64_t order = 0;
  /// The step that scheduled it (the program outlives the run).
  const step* source = nullptr;
};

/// `from` must finish before `to` goes on: a wait, a copy's source, a
/// kernel's input written earlier.
struct model_edge {
  int from_device = 0;
  int from_item = 0;
  int to_device = 0;
  int to_item = 0;
  std::string kind;
};

struct run_record {
  int64_t start_ns = 0;
  std::vector<std::string> device_names;
  std::vector<device_trace> traces;
  std::vector<slice> host_slices;
  std::vector<std::vector<model_item>> model;
  std::vector<model_edge> edges;
};

/// The timeline drawn from the traces: a slice per record, an arrow per
/// wait (the gate's, or the script's wait on an event already done).
timeline make_timeline(const run_record& rec, int devices);

/// The logical trace: the model with step numbers and Lamport clocks.
sexp make_logical(const run_record& rec, const run_result& r);

} // namespace multidev::scenario
