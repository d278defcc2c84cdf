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

#include "scenario/program.hpp"
#include "scenario/scenario.hpp"

namespace multidev::scenario {

struct step;

/// An item the script put on a device: about 48 bytes, the only record a
/// run keeps per item besides the devices' traces (docs/scenarios.md,
/// "Scale"); its texts are shared (`run_record::texts`).
struct model_item {
  /// Its seq in the device's schedule; 0 when the runtime queued nothing
  /// (a wait on an event already done).
  uint64_t seq = 0;
  /// Its place among all items of the run, in script order.
  uint64_t order = 0;
  /// The step that scheduled it; read during the run only (the result may
  /// outlive the program).
  const step* source = nullptr;
  /// Its description: an index into `run_record::texts`.
  uint32_t description = 0;
  /// The script's name for its event: an index into
  /// `run_record::event_names`, -1 for none.
  int32_t event = -1;
  /// The line of the step that scheduled it.
  int32_t line = 0;
  /// For an item of a `(replay NAME N)`: its replay's number (the
  /// round's `replays()` after it, from 1); 0 for every other item.
  uint32_t replay = 0;
  /// `task`, `gate`, `copy`, `memset` or `pool` (a static string).
  const char* kind = "task";
};

/// `from` must finish before `to` goes on: a wait, a copy's source, a
/// kernel's input written earlier.
struct model_edge {
  int from_device = 0;
  int from_item = 0;
  int to_device = 0;
  int to_item = 0;
  /// `wait`, `data`, `copy` or `war` (a static string).
  const char* kind = "wait";
};

struct run_record {
  int64_t start_ns = 0;
  std::vector<std::string> device_names;
  std::vector<device_trace> traces;
  std::vector<slice> host_slices;
  std::vector<std::vector<model_item>> model;
  std::vector<model_edge> edges;
  /// The items' descriptions, each once.
  std::vector<std::string> texts;
  /// The program's event names, by decl, and its families (their names
  /// made when asked: `event_name_of`).
  std::vector<std::string> event_names;
  std::vector<event_family> families;

  const std::string& description(const model_item& it) const { return texts[it.description]; }
  /// The item's event name, or an empty string.
  std::string event(const model_item& it) const {
    if (it.event < 0)
      return {};
    return event_name_of(families, it.event, [&](std::size_t d) { return event_names[d]; });
  }
};

/// The timeline drawn from the traces: a slice per record, an arrow per
/// wait (the gate's, or the script's wait on an event already done).
timeline make_timeline(const run_record& rec, int devices);

/// The logical trace: the model with step numbers and Lamport clocks.
sexp make_logical(const run_record& rec, const run_result& r);

/// Bytes the record holds (its vectors' capacity and the texts'): what the
/// run keeps per item, for `run_result::record_bytes`.
std::size_t bytes_of(const run_record& rec);

} // namespace multidev::scenario
