// libFuzzer harness for the scenario loader (scenario/scenario.hpp, load()).
//
// Expected: a program, or script_error (what load() documents for every
// mistake a script can make; the parser's errors arrive as script_error too).
// A finding: a crash, a sanitizer report, a hang or runaway memory (libFuzzer's
// -timeout and -rss_limit_mb), any other exception escaping (std::logic_error
// from a sexp accessor, std::out_of_range, ...), an error without its
// file:line:col, or a loaded program whose indices point outside its own
// tables (the runner indexes by them without checking).
// The fuzz build lowers the loader's step limit (MULTIDEV_SCENARIO_MAX_STEPS),
// so that a script at the limit loads in milliseconds, not seconds.
// MULTIDEV_FUZZ_VERBOSE=1 prints each input's verdict (to triage a corpus).
// Build and run: scripts/run-fuzz.sh (fuzz/CMakeLists.txt).
#include "scenario/program.hpp"
#include "scenario/scenario.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace scn = multidev::scenario;

namespace {

const std::string file = "fuzz.scn";
const bool verbose = std::getenv("MULTIDEV_FUZZ_VERBOSE") != nullptr;

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz_scenario: %s\n", what.c_str());
  std::abort();
}

bool within(int i, std::size_t n) {
  return i >= -1 && (i < 0 || static_cast<std::size_t>(i) < n);
}

void check_step(const scn::program& p, const scn::step& st) {
  auto where = st.where.str() + " " + st.text;
  // A step of an included file names that file (`include`).
  if (st.where.file.empty() || st.where.line < 1 || st.where.column < 1)
    broken("a step without its position: " + where);
  if (!within(st.device, static_cast<std::size_t>(p.devices)))
    broken("a step's device is out of range: " + where);
  if (!within(st.ctx, p.contexts.size()) || !within(st.ctx2, p.contexts.size())
      || !within(st.parent, p.contexts.size()))
    broken("a step's context is out of range: " + where);
  // Event ids count the declared events and each kept loop's iterations
  // (program::families), event_ids in all.
  auto events = static_cast<std::size_t>(p.event_ids);
  if (!within(st.as, events) || !within(st.ev, events) || !within(st.ev2, events))
    broken("a step's event is out of range: " + where);
  for (int t : st.tnodes)
    if (t < 0 || static_cast<std::size_t>(t) >= p.tnodes.size())
      broken("a step's tnode is out of range: " + where);
  bool node_op = st.kind == scn::op::kill_node || st.kind == scn::op::cut_node;
  bool round_op = st.kind == scn::op::round || st.kind == scn::op::replay;
  if (round_op ? st.host < 0 || static_cast<std::size_t>(st.host) >= p.rounds.size()
               : !within(st.host, node_op ? p.nodes.size() : p.hosts.size()))
    broken("a step's host (node, or round) is out of range: " + where);
  if (!within(st.round, p.rounds.size()))
    broken("a step's round is out of range: " + where);
  if (!within(st.hold, p.holds.size()))
    broken("a step's hold is out of range: " + where);
  if (st.dag >= 0 && (static_cast<std::size_t>(st.dag) >= p.dags.size() || st.dag_task < 0
                      || static_cast<std::size_t>(st.dag_task) >= p.dags[st.dag].events.size()))
    broken("a step's random-dag task is out of range: " + where);
  if (st.kind == scn::op::expect && st.what == scn::subject::action) {
    if (!st.action)
      broken("an expected action without its step: " + where);
    check_step(p, *st.action);
  }
}

void check_program(const scn::program& p) {
  if (p.devices < 1 || p.local_devices < 1 || p.local_devices > p.devices)
    broken("a program without devices");
  if (p.items.size() != static_cast<std::size_t>(p.devices))
    broken("items is not sized to the devices");
  if (p.event_ids < 0 || static_cast<std::size_t>(p.event_ids) < p.events.size())
    broken("event_ids counts fewer events than are declared");
  for (const auto& st : p.steps)
    check_step(p, st);
  // A round's body: steps of that round, with items a device each.
  for (std::size_t r = 0; r < p.rounds.size(); ++r) {
    const auto& rd = p.rounds[r];
    if (rd.body.empty() || rd.items.size() != static_cast<std::size_t>(p.devices))
      broken("a round without steps, or its items not sized to the devices: " + rd.name);
    for (const auto& st : rd.body) {
      if (st.round != static_cast<int>(r))
        broken("a round's step names another round: " + rd.name);
      check_step(p, st);
    }
  }
  // A random DAG's options: the runner indexes by these too.
  for (const auto& d : p.dags) {
    for (int h : d.hosts)
      if (!within(h, p.hosts.size()))
        broken("a random-dag's host buffer is out of range: " + d.name);
    if ((!d.hosts.empty() && d.hosts.size() != d.events.size())
        || (!d.expected.empty() && d.expected.size() != d.events.size())
        || (!d.reached_by.empty() && d.reached_by.size() != d.events.size()))
      broken("a random-dag's per-task tables are not sized to its tasks: " + d.name);
    for (int f : d.faults)
      if (!within(f, d.events.size()) || f < 0)
        broken("a random-dag's fault is out of range: " + d.name);
    if (d.first_tnode >= 0 && static_cast<std::size_t>(d.first_tnode) + d.events.size()
                                > p.tnodes.size())
      broken("a random-dag's buffers are out of range: " + d.name);
  }
  // A loop kept as a loop (program::repeats): within the steps, nested or
  // apart, outer blocks first.
  for (std::size_t i = 0; i < p.repeats.size(); ++i) {
    const auto& b = p.repeats[i];
    if (b.count == 0 || b.times < 2 || b.first + b.count > p.steps.size())
      broken("a repeat block out of range");
    for (std::size_t j = 0; j < i; ++j) {
      const auto& a = p.repeats[j];
      bool inside = b.first >= a.first && b.first + b.count <= a.first + a.count;
      if (b.first < a.first || (b.first < a.first + a.count && !inside))
        broken("repeat blocks out of order or overlapping");
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text{reinterpret_cast<const char*>(data), size};
  try {
    auto p = scn::load(text, file);
    if (!p)
      broken("load() returned null");
    check_program(*p);
    if (verbose)
      std::fprintf(stderr, "loaded: %zu step(s)\n", p->steps.size());
  } catch (const scn::script_error& e) {
    if (verbose)
      std::fprintf(stderr, "script_error: %s\n", e.what());
    const auto& w = e.where();
    // An error in an included file names that file, and then where it was
    // included from this one.
    bool names_file = w.file == file || std::string_view{e.what()}.find(
                                           "(in the file included at " + file + ":") !=
                                           std::string_view::npos;
    if (!names_file || w.line < 1 || w.column < 1)
      broken(std::string{"a script error without its file:line:col: "} + e.what());
  }
  return 0;
}
