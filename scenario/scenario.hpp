#pragma once
/// \file
/// Scenario scripts: a schedule written as s-expressions (docs/scenarios.md),
/// loaded into a checked program, run on a backend of local devices, and
/// turned into a report, a Chrome trace, a logical trace and an SVG timeline.
/// `multidev run` is a thin layer over this; tests use it directly.
///
/// Loading finds every mistake a script can make before anything runs
/// (syntax, unknown names, wrong types, duplicate names, bad devices) and
/// throws `script_error` with the `file:line:col` of the offending text.
/// Running never throws for what the schedule does (failed tasks, killed
/// devices): those are outcomes, checked by the script's expectations.

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <multidev/sexp.hpp>
#include <multidev/trace.hpp>

namespace caf {
class actor_system;
} // namespace caf

namespace multidev::scenario {

/// A place in a script.
struct location {
  std::string file;
  int line = 0;
  int column = 0;
  /// `file:line:col`.
  std::string str() const;
};

/// The script is wrong (exit status 2 of `multidev run`): `what()` is
/// `file:line:col: message`.
class script_error : public std::runtime_error {
public:
  script_error(location where, const std::string& message);
  const location& where() const noexcept { return where_; }
  /// The message without the location.
  const std::string& message() const noexcept { return message_; }

private:
  location where_;
  std::string message_;
};

/// A loaded script: every name resolved, every loop and generator expanded.
class program;

/// Loads a script from text; `file` names it in errors. `seed` overrides the
/// script's `(seed N)` (and the default, 1). `params` are the values of
/// the script's `(param NAME DEFAULT)` forms (`--param NAME=VALUE`), each a
/// whole number; one the script does not read is an error. Throws
/// `script_error`.
std::shared_ptr<const program> load(std::string_view text, const std::string& file,
                                    std::optional<uint64_t> seed = std::nullopt,
                                    const std::map<std::string, std::string>& params = {});

/// Reads and loads a file; an unreadable file is a `script_error` at `file:0:0`.
std::shared_ptr<const program> load_file(const std::string& path,
                                         std::optional<uint64_t> seed = std::nullopt,
                                         const std::map<std::string, std::string>& params = {});

/// Items done and scheduled on one device, for live progress.
struct device_progress {
  uint64_t done = 0;
  uint64_t scheduled = 0;
};

/// `12.3 s` under a minute, `4 min 05 s` under an hour, then `2 h 03 min`.
std::string elapsed_text(double seconds);

/// The live progress line for a terminal `width` columns wide: the time
/// since the run started, the items done of those scheduled in all, then
/// each device's (`d0 195/300`) as long as they fit, `...` for the rest. At
/// most `width - 1` columns (ASCII only, no control characters), so that
/// rewriting it after a carriage return leaves nothing of the last one.
std::string progress_line(const std::vector<device_progress>& devices, double elapsed_s,
                          std::size_t width);

struct run_options {
  /// The actor system the devices live in; a system of the backend's own
  /// when null (with CAF's middleman when the script has nodes).
  caf::actor_system* system = nullptr;
  /// Where the script's nodes run: name -> "host:port" of a `multidev node`.
  std::map<std::string, std::string> nodes;
  /// Start a `multidev node` process (the `tool`) for each node without an
  /// address, and stop them at the end.
  bool spawn_nodes = false;
  std::string tool;
  /// More arguments for the `multidev node` processes it starts (the TLS
  /// files, so that they speak as the run does).
  std::vector<std::string> node_args;
  /// The cookie file the run attaches its nodes with (empty: the default
  /// file, which the nodes it starts use too).
  std::string cookie_file;
  /// The longest a blocking step (`sync`, `await`, `kill`...) may take before
  /// it counts as a failed expectation and the run is stopped.
  double step_timeout_s = 60;
  /// Called on a progress thread every `progress_interval_s` once the run has
  /// taken `progress_after_s`; not called when empty.
  std::function<void(const std::vector<device_progress>&)> on_progress;
  double progress_after_s = 1.0;
  double progress_interval_s = 0.2;
  /// Build `run_result::tl` and `run_result::logical` at the end of the run
  /// (a few hundred bytes per item). When false they stay empty and the
  /// outputs are made from `run_result::record` when asked for:
  /// `write_chrome_trace` streams, `timeline_svg` and `logical_trace` build
  /// what they draw then.
  bool timeline = true;
};

/// What an expectation observed.
struct expectation_result {
  location where;
  /// The expectation as written.
  std::string text;
  bool held = false;
  /// What was seen (a value, an outcome, an error message).
  std::string observed;
};

/// The run as drawn (`multidev/trace.hpp`): a lane per device, then the
/// host's (the script's blocking steps, kind `host`, with `seq` 0); times
/// are `trace_clock_ns()` and `start_ns` is the run's start.
using slice = multidev::timeline_slice;
using flow = multidev::timeline_flow;
using timeline = multidev::timeline;

/// What the run kept to draw its outputs from: the devices' traces, the
/// script's items and edges (scenario/record.hpp).
struct run_record;

/// Everything a run produced.
struct run_result {
  std::string file;
  std::string scenario;
  uint64_t seed = 0;
  std::string backend;
  int devices = 0;
  std::vector<expectation_result> expectations;
  /// What went wrong without an expectation saying it would: steps (a
  /// `sync` that threw, a step that timed out), then the items that failed
  /// or were cancelled from a failure no expectation saw, in script order
  /// (`observed`: `failed on device 1: ...`). Each fails the run.
  std::vector<expectation_result> unexpected;
  /// Items the script scheduled per device.
  std::vector<uint64_t> items;
  int64_t wall_ns = 0;
  timeline tl;
  /// The schedule with logical clocks only (see `logical_trace`).
  sexp logical;
  /// Records a device's trace ring overwrote (0 unless the run is huge).
  uint64_t dropped_records = 0;
  /// What the outputs are made from; it holds no reference to the program.
  std::shared_ptr<const run_record> record;
  /// Bytes `record` holds: the run's own memory that grows with its items
  /// (about 160 per item: its place in the script's model and its trace
  /// record), besides the runtime's trace rings.
  std::size_t record_bytes = 0;

  /// Whether every expectation held and nothing unexpected happened.
  bool ok() const noexcept;
};

/// Runs a loaded program on a fresh backend of its devices. Throws
/// `script_error` only for what loading could not see (an argument the
/// backend refuses at run time, e.g. a memset past its pool).
run_result run(const program& p, const run_options& opts = {});

/// A few lines for a human: the scenario, its devices and items, each
/// failed expectation with what was observed, and the verdict.
std::string summary(const run_result& r);

/// The full result: `(report (scenario ..) (file ..) (seed ..) (verdict
/// passed|failed) (expectations (expect ..) ...) (unexpected ..) (devices ..))`.
sexp report(const run_result& r);

/// `multidev::chrome_trace_json` of `r.tl`: one thread per device plus the
/// host, a complete event per slice, a flow (`s`/`f` pair) per arrow;
/// `otherData` holds the scenario, seed, backend and verdict.
std::string chrome_trace_json(const run_result& r);

/// The same text written to `out` an event at a time from `r.record`,
/// without building the timeline or the document in memory (the memory it
/// takes does not grow with the run's items; `multidev run --trace`).
void write_chrome_trace(const run_result& r, std::ostream& out);

/// `multidev::timeline_svg` of `r.tl`, headed with the scenario and verdict.
std::string timeline_svg(const run_result& r);

/// The logical trace: `r.logical` printed one item per line, so the same
/// script and seed give the same text.
std::string logical_trace(const run_result& r);

} // namespace multidev::scenario
