#pragma once
// A loaded scenario: the flat list of steps the runner executes, every name
// replaced by an index into the program's tables. Internal to scenario/.

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <multidev/multidev.hpp>

#include "scenario/scenario.hpp"

namespace multidev::scenario {

/// How `(matches RE)` is compiled, in the loader (to check it) and the
/// runner (to match). ECMAScript syntax, with libstdc++'s `__polynomial`:
/// the matcher then walks the message breadth-first, in steps bounded by the
/// pattern, instead of recursing once per character of the message (which
/// overflowed the stack on a message of ~100,000 characters) or
/// backtracking exponentially; a back-reference is refused at load time.
inline constexpr auto matches_syntax =
  std::regex::ECMAScript | std::regex_constants::__polynomial;

enum class op : uint8_t {
  make_context, make_child, alloc_node, alloc_pool, free_pool, memset, kernel, wait,
  all_work, sync, await, sync_device, from_host, to_host, copy, cancel, kill, recover,
  delay, hold, release, expect, kill_node, cut_node, sync_in, detach_node, attach_node,
  sleep, await_hold, round, replay,
};

/// Host data for `from-host`.
struct host_data {
  enum class kind : uint8_t { fill, iota, values } how = kind::fill;
  double value = 0;
  std::vector<float> values;
};

/// What an expectation looks at.
enum class subject : uint8_t {
  action, state, before, idle, memory, checksum, host, resolved,
  // Time assertions, checked on the traces at the end of the run.
  overlap, after, within, concurrency,
};

/// What it expects of it.
enum class predicate : uint8_t {
  ok,         // the action succeeds
  fails,      // the action throws (with optional checks below)
  state_is,   // (state EV) done|failed|cancelled|pending
  before,     // (before A B)
  is_true, is_false,
  compare,    // (memory D) (<= N)
  values,     // (checksum R)/(host H): sum, count, all, at, values
};

struct step {
  op kind = op::make_context;
  location where;
  /// The form as written (for reports), after loop variables were substituted.
  std::string text;
  int device = -1;
  int ctx = -1;   // a context variable; -1 with device >= 0: a fresh context
  int ctx2 = -1;  // copy: the source context
  int parent = -1;
  std::vector<int> tnodes;
  int as = -1;    // the event it binds (an index into program::events)
  int ev = -1;    // the event it uses (a random-DAG copy: its source task's)
  int ev2 = -1;
  int host = -1;
  int hold = -1;
  /// A time assertion's second item when it is a hold (`ev2` when an event).
  int hold2 = -1;
  int64_t pool_id = 0;
  int64_t offset = 0;
  int64_t bytes = 0;
  int64_t align = 64;
  double ms = 0;
  std::string kernel;
  std::vector<link_arg> args;
  /// A task item a `fail-at` turned into a failure: the message it throws.
  std::optional<std::string> fail_with;
  /// `(delay-at EV MS)`: the task sleeps MS ms on its runner before its work.
  double held_ms = 0;
  /// `(cancel-at EV)`: the item is queued behind a hold and cancelled alone.
  bool cancel_here = false;
  /// `(kill-node-at EV [NODE])`/`(cut-node-at ...)`: the node (an index into
  /// program::nodes) stopped right after this step; -1 for none.
  int node_fault = -1;
  bool node_cut = false;
  /// `copy ... (into merge)`.
  bool into_merge = false;
  std::string message; // kill reason
  host_data data;
  /// For random-dag tasks: the step's index in its DAG (edges are checked),
  /// and the task's index there. A DAG with options tags every step of a
  /// task so (its alloc, copies, waits, kernels, to-host): a step of a
  /// task that a fault reaches may fail without failing the run.
  int dag = -1;
  int dag_task = -1;
  /// A step of a `(repeat ...)` kept once for iterations that differ in
  /// their names only: the index of its `event_family`, -1 otherwise.
  int family = -1;
  /// A step of a `(round NAME ...)` body: the round's index in
  /// `program::rounds`; -1 for every other step. `(round ...)` and
  /// `(replay ...)` steps name their round in `host`.
  int round = -1;
  /// `(replay NAME N)`: N.
  uint64_t times = 0;
  /// In such a step, whether `ev` is an event of the same iteration (a
  /// `(wait D k$i)` after `(as k$i)`), which moves with it.
  bool shifts_ev = false;
  /// In such a step, the kernel arguments that change with the iteration:
  /// (index into `args`, what it adds each iteration); `args` holds
  /// iteration 0's values.
  std::vector<std::pair<std::size_t, int64_t>> arg_steps;

  // -- expect ---------------------------------------------------------------
  subject what = subject::action;
  predicate pred = predicate::ok;
  std::shared_ptr<step> action;
  std::string state;
  std::string cmp; // = <= >= < >
  int64_t number = 0;
  std::optional<std::string> matches;
  std::optional<int> origin;
  std::optional<std::string> task;
  bool cancelled = false;
  std::optional<double> sum, all;
  std::optional<int64_t> count;
  std::optional<std::pair<int64_t, double>> at;
  std::optional<std::vector<float>> expect_values;
  double tolerance = 1e-6;
  /// Time assertions: `(at-least T)`/`(at-most T)` of `after` and `within`
  /// (ns), and of `concurrency` (devices) over the devices in `devs`.
  std::optional<int64_t> at_least, at_most;
  std::vector<int> devs;
};

struct event_decl {
  std::string name;
  location where;
  /// A `(within EV T)` reads when the step that makes it ran.
  bool timed = false;
  /// An event made inside `(round NAME ...)`: the round's index (the
  /// event is that item's event in the latest replay); -1 otherwise.
  int round = -1;
};

/// A `(round NAME FORM...)`: its body's steps, each recorded as one item
/// of the round (`backend::record`), in order, when the `(round ...)` step
/// runs; `(replay NAME N)` replays it.
struct round_decl {
  std::string name;
  location where;
  std::vector<step> body;
  /// Items per device one replay schedules at most (a copy counts two).
  std::vector<uint64_t> items;
};

struct host_decl {
  std::string name;
  int tnode = -1;
};

/// A generated DAG: its tasks' events and its edges (task index pairs).
struct dag_decl {
  std::string name;
  location where;
  std::vector<int> events;
  std::vector<int> devices;
  std::vector<std::pair<int, int>> edges; // (from, to): from finishes before to starts
  /// `(data)`: per task, the host buffer (an index into program::hosts)
  /// its value is read back into (-1 for a task a fault reaches), and the
  /// value the loader computed for it.
  std::vector<int> hosts;
  std::vector<float> expected;
  /// `(faults K)`: the tasks drawn to fail, and per task the faults that
  /// reach it (bit j: faults[j]) through its edges or its device's order;
  /// empty without (transfers P), (data) or (faults K).
  std::vector<int> faults;
  std::vector<uint64_t> reached_by;
  /// With options: task i's buffer is tnode `first_tnode + i`, and its
  /// dependencies are among the `window` tasks before it (the runner keeps
  /// only their buffers in the DAG's contexts).
  int first_tnode = -1;
  int window = 0;
};

/// A node of other processes' devices (`(nodes (NAME N) ...)`): its
/// devices take the ordinals `first .. first + devices - 1`.
struct node_decl {
  std::string name;
  int devices = 0;
  int first = 0;
  location where;
  /// `(NAME N (session-of OTHER))`: the index of node OTHER, whose process
  /// this one is too, attached again as a second client (a session of its
  /// own: its own pools, queue and failures); -1 otherwise.
  int session_of = -1;
};

/// A `(repeat N ...)` whose iterations are all alike (see `alike_body` in
/// loader.cpp): its first iteration's steps, `steps[first, first + count)`,
/// stand for all `times` of them, run that many times in a row. Blocks nest
/// (an inner loop's lies within an outer one's steps) and never overlap
/// otherwise; `program::repeats` is sorted by `first`, outer blocks first.
struct repeat_block {
  std::size_t first = 0;
  std::size_t count = 0;
  uint64_t times = 1;
  /// A block of named iterations: its `event_family`, -1 for a block of
  /// alike iterations.
  int family = -1;
};

/// The events of a `(repeat N ...)` whose iterations differ only in the
/// names they bind (`(as k$i)`, see `named_body` in loader.cpp): its first
/// iteration's steps stand for all N, and iteration t's j-th event has the
/// id `first + t * per_iter + j` and the name `parts[j].first + t +
/// parts[j].second`, made when that iteration runs. Its events' decls are
/// those of iteration 0 (`program::events[decl + j]`).
struct event_family {
  int first = 0;
  int per_iter = 0;
  uint64_t times = 0;
  std::size_t decl = 0;
  /// Its block's first step (an index into `program::steps`).
  std::size_t step = 0;
  std::vector<std::pair<std::string, std::string>> parts;
  /// The forms' texts with the loop variable's value `text_marker`, for
  /// the texts of iteration t (`family_text`).
  std::vector<std::string> texts;
  int end() const { return first + per_iter * static_cast<int>(times); }
};

/// Where the loop variable's value stands in `event_family::texts`.
inline constexpr const char* text_marker = "9223372036854775007";

/// An event id's decl (an index into `program::events`) and, for one of a
/// family's, its family and iteration (-1 for a plain event).
struct event_locus {
  std::size_t decl = 0;
  int family = -1;
  int64_t iter = -1;
  int slot = 0;
};

inline event_locus locate_event(const std::vector<event_family>& families, int id) {
  // The last family that starts at or before id.
  auto it = std::upper_bound(families.begin(), families.end(), id,
                             [](int x, const event_family& f) { return x < f.first; });
  if (it == families.begin())
    return event_locus{static_cast<std::size_t>(id)};
  const auto& f = *(it - 1);
  if (id < f.end()) {
    auto k = id - f.first;
    return event_locus{f.decl + static_cast<std::size_t>(k % f.per_iter),
                       static_cast<int>(it - 1 - families.begin()), k / f.per_iter,
                       k % f.per_iter};
  }
  return event_locus{f.decl + static_cast<std::size_t>(f.per_iter)
                     + static_cast<std::size_t>(id - f.end())};
}

/// The name of event `id`: its decl's, or its family's for its iteration.
template <class DeclName>
std::string event_name_of(const std::vector<event_family>& families, int id,
                          DeclName&& decl_name) {
  auto l = locate_event(families, id);
  if (l.family < 0)
    return decl_name(l.decl);
  const auto& p = families[static_cast<std::size_t>(l.family)].parts[static_cast<std::size_t>(l.slot)];
  return p.first + std::to_string(l.iter) + p.second;
}

/// The text of a family's step (its index `k` in the block) in iteration t.
inline std::string family_text(const event_family& f, std::size_t k, int64_t t) {
  const auto& s = f.texts[k];
  std::string out;
  std::string_view m{text_marker};
  auto value = std::to_string(t);
  std::size_t i = 0;
  for (auto at = s.find(m); at != std::string::npos; at = s.find(m, i)) {
    out.append(s, i, at - i);
    out += value;
    i = at + m.size();
  }
  out.append(s, i);
  return out;
}

/// A fault aimed by name at an event of a family: the fields of `step`
/// that the iteration's copy takes.
struct family_fault {
  std::optional<std::string> fail_with;
  double held_ms = 0;
  bool cancel_here = false;
  int node_fault = -1;
  bool node_cut = false;
};

class program {
public:
  std::string file;
  std::string name;
  uint64_t seed = 1;
  std::string backend = "cpu";
  /// All devices: the local ones, then the nodes'.
  int devices = 0;
  int local_devices = 0;
  std::vector<node_decl> nodes;
  std::size_t queue_capacity = std::size_t{1} << 16;
  std::vector<tnode> tnodes;
  std::vector<std::string> contexts;
  /// Declared events, by decl (an event's id is its decl's index when no
  /// `families` precede it; see `locate_event`).
  std::vector<event_decl> events;
  std::vector<event_family> families;
  /// Event ids in all (decls, and each family's iterations).
  int event_ids = 0;
  /// Faults aimed at events of families, by event id.
  std::map<int, family_fault> family_faults;
  /// `(within EV T)` events of families.
  std::set<int> timed_family;
  std::vector<host_decl> hosts;
  std::vector<std::string> holds;
  std::vector<dag_decl> dags;
  std::vector<round_decl> rounds;
  /// The steps in script order; a loop in `repeats` is here once.
  std::vector<step> steps;
  std::vector<repeat_block> repeats;
  /// Steps the script runs: `steps.size()` with each block counted `times`.
  uint64_t steps_run = 0;
  /// Items per device the script schedules at most (sizes the trace rings).
  std::vector<uint64_t> items;

  std::string event_name(int id) const {
    return event_name_of(families, id, [&](std::size_t d) { return events[d].name; });
  }
  bool event_timed(int id) const {
    auto l = locate_event(families, id);
    return l.family < 0 ? events[l.decl].timed : timed_family.count(id) > 0;
  }
};

} // namespace multidev::scenario
