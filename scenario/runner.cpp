// Running a loaded scenario on a backend of local devices, step by step on
// the calling thread, and collecting what the traces and the report need.
#include "scenario/program.hpp"
#include "scenario/node_process.hpp"
#include "scenario/record.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <fmt/format.h>

#include <multidev/protocol.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <cstring>
#include <regex>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>


namespace multidev::scenario {

bool run_result::ok() const noexcept {
  return unexpected.empty()
         && std::all_of(expectations.begin(), expectations.end(),
                        [](const auto& e) { return e.held; });
}

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

/// A `(hold ...)`: the held device's runner waits on it until `(release
/// ...)` or the end of the run (a step that times out behind a forgotten
/// release ends the run, which releases it).
struct hold_latch {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  /// The device's runner took the hold (`await-hold` waits for this).
  std::atomic<bool> entered{false};

  void release() {
    {
      std::lock_guard guard{mu};
      open = true;
    }
    cv.notify_all();
  }

  /// The hold's task: marks the hold entered, then blocks the calling
  /// runner until `release`.
  void hold() {
    entered.store(true);
    std::unique_lock lock{mu};
    cv.wait(lock, [&] { return open; });
  }
};

/// Sleeps `ms` milliseconds (`delay`, `delay-at`, `sleep`).
void sleep_ms(double ms) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

/// An event a `(sync-in ...)` task waits for: the host makes it (maybe after
/// the task started), the task takes it on its runner. Closed at the end of
/// the run: a task still waiting then fails, naming the event never made.
struct event_slot {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<event> made;
  bool closed = false;

  void set(const event& e) {
    {
      std::lock_guard guard{mu};
      made = e;
    }
    cv.notify_all();
  }
  void close() {
    {
      std::lock_guard guard{mu};
      closed = true;
    }
    cv.notify_all();
  }
  /// The event once made; nothing when closed or after `timeout_s`.
  std::optional<event> wait(double timeout_s) {
    std::unique_lock lock{mu};
    cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                [&] { return made.has_value() || closed; });
    return made;
  }
};

/// A refused argument of a round's body step, found when the round is
/// recorded: a script error at that step's place, not the round's.
struct refused_in_round : std::invalid_argument {
  refused_in_round(location w, const std::string& m) : std::invalid_argument(m), where(std::move(w)) {}
  location where;
};

/// A blocking step that ran out of time.
struct step_timeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class runner_state {
public:
  runner_state(const program& p, const run_options& opts)
    : p_(p),
      opts_(opts),
      bp_(opts.system ? std::make_unique<backend>(*opts.system, options_for(p))
                      : std::make_unique<backend>(options_for(p))),
      b_(*bp_) {
    attach_nodes();
    for (int i = 0; i < p.devices; ++i)
      devices_.push_back(b_.get_device(i));
    contexts_.resize(p.contexts.size());
    events_.resize(static_cast<std::size_t>(p.event_ids));
    event_items_.resize(static_cast<std::size_t>(p.event_ids), {-1, -1});
    hosts_.resize(p.hosts.size());
    host_done_.resize(p.hosts.size());
    holds_.resize(p.holds.size());
    hold_items_.resize(p.holds.size(), {-1, -1});
    scheduled_ns_.resize(static_cast<std::size_t>(p.event_ids), -1);
    slots_.resize(static_cast<std::size_t>(p.event_ids));
    rounds_.resize(p.rounds.size());
    for (auto& h : holds_)
      h = std::make_shared<hold_latch>();
    model_.resize(p.devices);
    // Its items, known from the load (a copy counts two there): no
    // doubling of a million-item vector at the end of the run.
    for (int d = 0; d < p.devices; ++d)
      model_[d].reserve(static_cast<std::size_t>(p.items[d]));
    result_.file = p.file;
    // Named after the file, not the path it was given by, so a logical
    // trace does not depend on the directory it was run from.
    result_.scenario = p.name.empty() ? std::filesystem::path{p.file}.stem().string() : p.name;
    result_.seed = p.seed;
    result_.backend = b_.name();
    result_.devices = p.devices;
    result_.items.assign(p.devices, 0);
  }

  ~runner_state() {
    release_holds();
    stop_progress();
    // The backend goes first, while everything its items use is still here:
    // a run a script error ended leaves items queued (released holds let
    // them run), and they write `hosts_` (to-host), read `host_data_`
    // (from-host) and call closures holding `this`.
    bp_.reset();
  }

  run_result go() {
    start_ = trace_clock_ns();
    auto t0 = clock::now();
    start_progress();
    run_steps(0, p_.steps.size(), 0);
    finish();
    stop_nodes();
    stop_progress();
    result_.wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0)
                        .count();
    for (int d = 0; d < p_.devices; ++d)
      result_.items[d] = model_[d].size();
    build_outputs();
    return std::move(result_);
  }

private:
  static backend_options options_for(const program& p) {
    backend_options o;
    o.driver = p.backend;
    o.num_devices = p.local_devices;
    o.queue_capacity = p.queue_capacity;
    o.on_destroy = backend_options::destroy_policy::cancel;
    uint64_t most = 0;
    for (auto n : p.items)
      most = std::max(most, n);
    // Room for every item (and the gates transfers add), up to 4 Mi records.
    o.trace_capacity = static_cast<std::size_t>(std::min<uint64_t>(2 * most + 256, 1u << 22));
    return o;
  }

  /// Attaches each node (at its address, or a process started for it), so
  /// its devices take the ordinals the script gave them.
  void attach_nodes() {
    for (const auto& n : p_.nodes)
      attach_one(n);
  }

  /// The node whose process `n` is: itself, or the node it is a session of.
  const node_decl& process_of(const node_decl& n) const {
    return n.session_of >= 0 ? p_.nodes[static_cast<std::size_t>(n.session_of)] : n;
  }

  /// Attaches `n` (again, after a `detach` or a loss: a new session), and
  /// puts its devices at their ordinals. `again` (an `(attach NAME)` step):
  /// a node that cannot be reached yet (a link healing, a node restarting)
  /// is tried again until the step timeout.
  void attach_one(const node_decl& n, bool again = false) {
    const auto& proc = process_of(n);
    std::string address;
    if (auto it = opts_.nodes.find(proc.name); it != opts_.nodes.end()) {
      address = it->second;
    } else if (opts_.spawn_nodes) {
      auto sp = spawned_.find(proc.name);
      if (sp == spawned_.end() || !sp->second->running()) {
        // Its stderr is kept aside, shown if it exits badly (stop_nodes).
        // Started again after a kill-node: a restart under the same name.
        spawned_.erase(proc.name);
        spawned_.emplace(proc.name, std::make_unique<node_process>(
                                      opts_.tool, proc.devices, proc.name, false, opts_.node_args));
      } else {
        sp->second->resume(); // after a cut-node: the link is back
      }
      address = spawned_.at(proc.name)->address();
    } else {
      throw script_error(n.where, fmt::format("node '{}' has no address: give --node "
                                              "{}=HOST:PORT, or --spawn-nodes",
                                              proc.name, proc.name));
    }
    auto colon = address.rfind(':');
    int port = colon == std::string::npos ? -1 : std::atoi(address.c_str() + colon + 1);
    if (port <= 0 || port > 65535)
      throw script_error(n.where, fmt::format("node '{}': '{}' is not HOST:PORT", proc.name,
                                              address));
    std::vector<device> ds;
    try {
      // The node must call itself what the script calls it (--node NAME=...);
      // a second session of it goes under its own name.
      node_attach_options o;
      o.expected_name = proc.name;
      o.name = n.name;
      o.cookie_file = opts_.cookie_file;
      if (again) {
        o.retry_unreachable = true;
        o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::duration<double>(opts_.step_timeout_s));
      }
      ds = attach_node(b_, address.substr(0, colon), static_cast<uint16_t>(port), o);
    } catch (const std::exception& e) {
      throw script_error(n.where, fmt::format("node '{}': {}", n.name, e.what()));
    }
    if (static_cast<int>(ds.size()) != n.devices || ds.front().ordinal() != n.first)
      throw script_error(n.where, fmt::format("node '{}' at {} serves {} device(s), the script "
                                              "declares {}",
                                              n.name, address, ds.size(), n.devices));
    for (std::size_t i = 0; i < ds.size(); ++i)
      if (static_cast<std::size_t>(n.first) + i < devices_.size())
        devices_[static_cast<std::size_t>(n.first) + i] = ds[i];
  }

  /// `(detach NAME)` and `(attach NAME)`.
  void detach_or_attach(const step& st) {
    const auto& n = p_.nodes[st.host];
    auto start = trace_clock_ns();
    close_books(n);
    if (st.kind == op::detach_node) {
      detach_node(b_, n.name);
    } else {
      try {
        attach_one(n, true);
      } catch (const script_error& e) {
        throw std::invalid_argument(e.what());
      }
    }
    host_slice((st.kind == op::detach_node ? "detach " : "attach ") + n.name, start, false);
  }

  void kill_node(const step& st) {
    const auto& n = p_.nodes[st.host];
    auto it = spawned_.find(process_of(n).name);
    if (it == spawned_.end())
      throw std::invalid_argument(fmt::format("{} {}: the run did not start this node "
                                              "(--spawn-nodes), so it cannot stop it",
                                              st.kind == op::cut_node ? "cut-node" : "kill-node",
                                              n.name));
    // What its devices did so far, for the traces: they cannot be asked later.
    for (int d = n.first; d < n.first + n.devices; ++d)
      try {
        last_traces_[d] = b_.trace(dev(d));
      } catch (const std::exception&) {
      }
    auto start = trace_clock_ns();
    bool cut = st.kind == op::cut_node;
    if (cut)
      it->second->pause(); // silent, connection open: found out by heartbeat
    else
      it->second->kill9();
    host_slice((cut ? "cut-node " : "kill-node ") + n.name, start, false);
  }

  // -- steps -------------------------------------------------------------------

  /// Runs steps [lo, hi) in order, a `repeat_block` starting there `times`
  /// times; `k`: the first block of `p_.repeats` not entered yet.
  void run_steps(std::size_t lo, std::size_t hi, std::size_t k) {
    const auto& blocks = p_.repeats;
    for (std::size_t i = lo; i < hi && !stopped_;) {
      while (k < blocks.size() && blocks[k].first < i)
        ++k; // within a block run already
      if (k < blocks.size() && blocks[k].first == i && i + blocks[k].count <= hi) {
        const auto& b = blocks[k];
        if (b.family >= 0)
          run_family(b);
        else
          for (uint64_t t = 0; t < b.times && !stopped_; ++t)
            run_steps(b.first, b.first + b.count, k + 1);
        i = b.first + b.count;
        ++k;
        continue;
      }
      execute_top(p_.steps[i]);
      ++i;
    }
  }

  /// Runs a block of named iterations (`event_family`): a copy of its
  /// steps, each iteration's events (and the faults aimed at them) set in
  /// it before it runs.
  void run_family(const repeat_block& b) {
    const auto& fam = p_.families[static_cast<std::size_t>(b.family)];
    auto first = p_.steps.begin() + static_cast<std::ptrdiff_t>(b.first);
    scratch_.assign(first, first + static_cast<std::ptrdiff_t>(b.count));
    // Their items' sources are the program's steps, their kernels'
    // descriptions those steps' (the same in every iteration).
    // (Arguments that change with the iteration are described each time.)
    for (std::size_t k = 0; k < b.count; ++k)
      if (scratch_[k].kind == op::kernel && scratch_[k].arg_steps.empty())
        kernel_texts_[&scratch_[k]] = kernel_text(p_.steps[b.first + k]);
    // An item whose text names the iteration but binds no event (a wait
    // on the same iteration's event) tells its iteration by its order.
    bool orders = false;
    for (std::size_t k = 0; k < b.count; ++k)
      orders = orders || (p_.steps[b.first + k].as < 0
                          && fam.texts[k].find(text_marker) != std::string::npos);
    for (uint64_t t = 0; t < b.times && !stopped_; ++t) {
      iteration_ = static_cast<int64_t>(t);
      if (orders && t == 0)
        family_runs_.push_back(family_run{b.family, {}});
      if (orders)
        family_runs_.back().starts.push_back(next_order_);
      auto shift = static_cast<int>(t) * fam.per_iter;
      for (std::size_t k = 0; k < b.count && !stopped_; ++k) {
        auto& st = scratch_[k];
        const auto& tmpl = p_.steps[b.first + k];
        st.as = tmpl.as >= 0 ? tmpl.as + shift : -1;
        st.ev = tmpl.shifts_ev ? tmpl.ev + shift : tmpl.ev;
        for (auto [a, d] : tmpl.arg_steps) {
          // Checked at load: the last iteration's value is in range.
          auto add = static_cast<int64_t>(t) * d;
          if (const auto* v = std::get_if<int64_t>(&tmpl.args[a]))
            st.args[a] = *v + add;
          else
            st.args[a] = static_cast<double>(static_cast<int64_t>(std::get<double>(tmpl.args[a]))
                                             + add);
        }
        if (!p_.family_faults.empty() && st.as >= 0) {
          auto it = p_.family_faults.find(st.as);
          auto none = family_fault{};
          const auto& x = it != p_.family_faults.end() ? it->second : none;
          st.fail_with = x.fail_with;
          st.held_ms = x.held_ms;
          st.cancel_here = x.cancel_here;
          st.node_fault = x.node_fault;
          st.node_cut = x.node_cut;
        }
        source_ = &tmpl;
        execute_top(st);
        source_ = nullptr;
      }
    }
    for (auto& st : scratch_)
      kernel_texts_.erase(&st);
    scratch_.clear();
    iteration_ = -1;
  }

  /// A step's text as written, after loop substitution: a named block's
  /// (a step of `scratch_` or its source) for the iteration running, or
  /// for iteration `t`.
  std::string text_of(const step& st, int64_t t = -1) const {
    if (st.family < 0)
      return st.text;
    const auto& fam = p_.families[static_cast<std::size_t>(st.family)];
    auto k = &st >= scratch_.data() && &st < scratch_.data() + scratch_.size()
               ? static_cast<std::size_t>(&st - scratch_.data())
               : static_cast<std::size_t>(&st - &p_.steps[fam.step]);
    return family_text(fam, k, t >= 0 ? t : iteration_);
  }

  /// Runs a step; what goes wrong becomes an unexpected result, except a
  /// refused argument, which is the script's mistake.
  void execute_top(const step& st) {
    if (st.dag >= 0 && st.kind == op::alloc_node)
      trim_dag_context(st);
    if (poisoned_dag_step(st))
      return execute_poisoned(st);
    try {
      execute(st);
    } catch (const std::invalid_argument& e) {
      never_made(st);
      const auto* in = dynamic_cast<const refused_in_round*>(&e);
      throw script_error(in ? in->where : st.where, e.what());
    } catch (const step_timeout& e) {
      never_made(st);
      unexpected(st, e.what());
      stopped_ = true; // the run cannot go on in order; wrap up
    } catch (const device_error& e) {
      never_made(st);
      unexpected(st, e.what());
      saw(e); // reported here: the items that failed from it are not listed again
    } catch (const std::exception& e) {
      never_made(st);
      unexpected(st, e.what());
    }
  }

  /// Before task i of a random DAG with options allocates its buffer: its
  /// device's DAG context becomes a root holding only the buffers of the
  /// tasks a later task may read (the `window` before i, and i's own):
  /// each alloc and copy derives a context holding all the buffers so far,
  /// with the one before as its parent, so that a chain of N of them, each
  /// kept by its items, would hold O(N^2) entries.
  void trim_dag_context(const step& st) {
    const auto& dag = p_.dags[st.dag];
    auto& c = contexts_[st.ctx];
    if (!c)
      return;
    auto keep_from = dag.first_tnode + st.dag_task - dag.window;
    ctx_buffers kept;
    for (const auto& [t, loc] : c->buffers)
      if (t.id - 1 < dag.first_tnode || t.id - 1 >= keep_from)
        kept.emplace(t, loc);
    c = b_.make_context(c->device, std::move(kept));
  }

  /// A step of a random-DAG task that one of the DAG's `(faults K)` reaches
  /// (`dag_decl::reached_by`): its device or a device it waits on fails, so
  /// the step may be refused; `check_dag_faults` judges the task.
  bool poisoned_dag_step(const step& st) const {
    return st.dag >= 0 && !p_.dags[st.dag].reached_by.empty()
           && p_.dags[st.dag].reached_by[st.dag_task] != 0;
  }

  void execute_poisoned(const step& st) {
    // Every refusal counts, a refused argument too: the DAG's steps are
    // generated, and one refused because an earlier step of the task was
    // (its alloc on the failed device) is no mistake of the script.
    try {
      execute(st);
    } catch (const device_error& e) {
      never_made(st);
      saw(e);
      dag_refused_.emplace(std::pair{st.dag, st.dag_task}, e.cause().message);
    } catch (const std::exception& e) {
      never_made(st);
      // A wait on a task that was refused, or a copy of its buffer: that
      // task's error.
      if (st.kind == op::wait || st.kind == op::copy)
        if (auto p = dag_task_of(st.dag, st.ev); p >= 0)
          if (auto it = dag_refused_.find({st.dag, p}); it != dag_refused_.end()) {
            dag_refused_.emplace(std::pair{st.dag, st.dag_task}, it->second);
            return;
          }
      dag_refused_.emplace(std::pair{st.dag, st.dag_task}, e.what());
    }
  }

  /// The task of DAG `d` that makes event `ev`, or -1 (its events are made
  /// in task order, so their ids increase).
  int dag_task_of(int d, int ev) const {
    const auto& es = p_.dags[d].events;
    auto it = std::lower_bound(es.begin(), es.end(), ev);
    return it != es.end() && *it == ev ? static_cast<int>(it - es.begin()) : -1;
  }

  /// A step that failed before making its event: a `(sync-in ...)` task
  /// waiting for that event learns at once that it never will be made.
  void never_made(const step& st) {
    if (st.as >= 0 && !events_[st.as] && slots_[st.as])
      slots_[st.as]->close();
  }

  void unexpected(const step& st, const std::string& what) {
    result_.unexpected.push_back(expectation_result{st.where, text_of(st), false, what});
  }

  const device& dev(int d) const { return devices_[d]; }

  /// Device `d`'s trace as it is now; an empty one marked unreachable when
  /// it cannot be read.
  device_trace trace_now(int d) {
    device_trace t{dev(d).name(), 0, {}, 0};
    try {
      t = b_.trace(dev(d));
    } catch (const std::exception&) {
      t.unreachable = "its trace could not be read";
    }
    return t;
  }

  context ctx_of(const step& st) {
    if (st.ctx < 0)
      return b_.make_context(dev(st.device));
    return *contexts_[st.ctx];
  }

  uint64_t last_seq(int d) const { return recording_ ? 0 : b_.all_work(dev(d)).seq(); }

  /// Whether everything scheduled on `d` has resolved (done, failed or
  /// cancelled): `is_idle` stays false on a failed device.
  bool settled(int d) const {
    try {
      return b_.state(b_.all_work(dev(d))) != event_state::pending;
    } catch (const std::exception&) {
      return true; // a device that cannot answer has nothing left to run
    }
  }

  /// Adds an item of the script to device `d`'s model: its seq when the
  /// runtime queued one since `before` (0 otherwise).
  int add_item(int d, uint64_t before, const char* kind, std::string_view description, int as,
               const step& st) {
    return add_item(d, before, kind, intern(description), as, st);
  }

  int add_item(int d, uint64_t before, const char* kind, uint32_t description, int as,
               const step& st) {
    if (recording_)
      return -1; // a round's item: modelled at each replay (replay_round)
    uint64_t seq = last_seq(d);
    model_[d].push_back(model_item{seq > before ? seq : 0, next_order_++,
                                   source_ ? source_ : &st, description, as, st.where.line, 0,
                                   kind});
    int idx = static_cast<int>(model_[d].size()) - 1;
    if (as >= 0) {
      bind_event(as, b_.all_work(dev(d)));
      event_items_[as] = {d, idx};
    }
    return idx;
  }

  /// The index of `text` in `texts_`, added the first time.
  uint32_t intern(std::string_view text) {
    auto it = text_ids_.find(text);
    if (it != text_ids_.end())
      return it->second;
    auto id = static_cast<uint32_t>(texts_.size());
    texts_.emplace_back(text);
    text_ids_.emplace(texts_.back(), id);
    return id;
  }

  /// The text of the step that scheduled `it`; of a named block's, for
  /// the iteration its event tells (its text names the variable nowhere
  /// else, see `named_loop` in loader.cpp).
  std::string item_text(const model_item& it) const {
    const auto& st = *it.source;
    if (it.replay > 0)
      return fmt::format("replay {} of round '{}': {}", it.replay,
                         p_.rounds[static_cast<std::size_t>(st.round)].name, st.text);
    if (st.family < 0)
      return st.text;
    auto l = it.event >= 0 ? locate_event(p_.families, it.event) : event_locus{};
    if (l.family >= 0)
      return text_of(st, l.iter);
    // The run of its block that holds its order (runs in order), and there
    // the last iteration that began at or before it.
    auto run = std::upper_bound(family_runs_.begin(), family_runs_.end(), it.order,
                                [](uint64_t o, const family_run& r) {
                                  return o < r.starts.front();
                                });
    if (run == family_runs_.begin() || (run - 1)->family != st.family)
      return text_of(st, 0); // its text names no iteration
    const auto& starts = (run - 1)->starts;
    auto t = std::upper_bound(starts.begin(), starts.end(), it.order) - starts.begin() - 1;
    return text_of(st, static_cast<int64_t>(t));
  }

  /// `describe_kernel(st)` interned, once per step (a loop's step runs many
  /// times).
  uint32_t kernel_text(const step& st) {
    if (!st.arg_steps.empty())
      return intern(describe_kernel(st));
    auto [it, added] = kernel_texts_.try_emplace(&st, 0);
    if (added)
      it->second = intern(describe_kernel(st));
    return it->second;
  }

  void add_edge(std::pair<int, int> from, int to_dev, int to_item, const char* kind) {
    if (from.first < 0 || from.second < 0 || to_item < 0)
      return;
    edges_.push_back(model_edge{from.first, from.second, to_dev, to_item, kind});
  }

  /// The model item an event stands for: the device's last item at or
  /// before its seq.
  std::pair<int, int> item_of_event(int ev) const {
    return event_items_[ev];
  }

  /// Makes event `id`, and hands it to a `(sync-in ...)` task waiting for it.
  void bind_event(int id, const event& e) {
    events_[id] = e;
    if (slots_[id] && !recording_) // a recorded event cannot be synced
      slots_[id]->set(e);
  }

  const event& ev(int id) const {
    if (!events_[id] && !recording_)
      if (auto r = p_.events[locate_event(p_.families, id).decl].round; r >= 0)
        throw std::runtime_error(fmt::format(
          "event '{}' was never made: it is an item of round '{}', which no (replay {} N) "
          "has run yet",
          p_.event_name(id), p_.rounds[r].name, p_.rounds[r].name));
    if (!events_[id])
      throw std::runtime_error(fmt::format("event '{}' was never made: the step that makes it "
                                           "did not run",
                                           p_.event_name(id)));
    return *events_[id];
  }

  /// Waits, at most the step timeout, for `done()` to hold.
  template <class F>
  void bounded(const char* what, F done) {
    auto deadline = clock::now() + std::chrono::duration<double>(opts_.step_timeout_s);
    for (int i = 0; !done(); ++i) {
      if (clock::now() > deadline)
        throw step_timeout(fmt::format("{} did not finish within {} s (the step timeout)", what,
                                       opts_.step_timeout_s));
      if (i < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(i < 1000 ? 50us : 1ms);
    }
  }

  /// A task on the device that syncs on an event when it runs: a blocking
  /// wait inside a task, which the runtime refuses (deadlock_error, naming
  /// the cycle) when it would close a cycle of runners.
  /// `(delay DEVICE MS)` on a node's device: a closure does not travel, a
  /// named kernel does; `spin_ns` keeps the node's runner busy for MS ms.
  void remote_delay(const step& st) {
    task_spec spec{"spin_ns", {static_cast<int64_t>(st.ms * 1e6)}};
    if (st.fail_with)
      spec = task_spec{"fail", {*st.fail_with}};
    auto before = last_seq(st.device);
    auto e = b_.schedule_named(dev(st.device), spec);
    add_item(st.device, before, "task", fmt::format("delay {} ms", st.ms), st.as, st);
    if (st.as >= 0)
      bind_event(st.as, e);
  }

  /// `(sync-in DEVICE EVENT)` on a node's device, by messages: a wait for
  /// EVENT (made by an earlier step, the loader checked) queued on the
  /// device, then a named `spin_ns 0` task, the item `(as EV)` names. The
  /// device's runner blocks at the wait as it would in the task's sync, and
  /// fails when EVENT fails, as the task would.
  void remote_sync_in(const step& st) {
    auto c = ctx_of(st);
    auto before = last_seq(st.device);
    const auto& e = ev(st.ev);
    b_.will_wait_for(c, e);
    auto from = item_of_event(st.ev);
    if (from.first != st.device) {
      int idx = add_item(st.device, before, "gate",
                         fmt::format("wait for {}", p_.event_name(st.ev)), -1, st);
      add_edge(from, st.device, idx, "wait");
    }
    task_spec spec{"spin_ns", {int64_t{0}}};
    if (st.fail_with)
      spec = task_spec{"fail", {*st.fail_with}};
    before = last_seq(st.device);
    auto done = b_.schedule_named(dev(st.device), spec);
    add_item(st.device, before, "task", "sync-in " + p_.event_name(st.ev), st.as, st);
    if (st.as >= 0)
      bind_event(st.as, done);
  }

  void sync_in(const step& st) {
    if (!dev(st.device).is_local())
      return remote_sync_in(st);
    auto& slot = slots_[st.ev];
    if (!slot)
      slot = std::make_shared<event_slot>();
    if (events_[st.ev])
      slot->set(*events_[st.ev]);
    auto before = last_seq(st.device);
    const auto& name = p_.event_name(st.ev);
    auto desc = "sync-in " + name;
    auto timeout = opts_.step_timeout_s;
    const backend* b = &b_;
    b_.schedule_task(dev(st.device), {desc, faulted(st, [slot, b, timeout, name] {
                                        auto e = slot->wait(timeout);
                                        if (!e)
                                          throw std::runtime_error(fmt::format(
                                            "sync-in: event '{}' was never made: the step "
                                            "that makes it failed or never ran (its producer "
                                            "is missing)",
                                            name));
                                        b->sync(*e);
                                      })});
    add_item(st.device, before, "task", desc, st.as, st);
  }

  void host_slice(const std::string& name, int64_t start, bool failed) {
    host_slices_.push_back(slice{p_.devices, name, "host", start, trace_clock_ns(), failed, 0, {}});
  }

  void sync_event(int id) {
    const auto& e = ev(id);
    auto start = trace_clock_ns();
    try {
      // The deadline's error names the chain of waits that holds the event.
      try {
        b_.sync(e, clock::now() + std::chrono::duration_cast<clock::duration>(
                                    std::chrono::duration<double>(opts_.step_timeout_s)));
      } catch (const timeout_error& t) {
        throw step_timeout(fmt::format("sync {} did not finish within {} s (the step timeout): {}",
                                       p_.event_name(id), opts_.step_timeout_s, t.chain()));
      }
    } catch (...) {
      host_slice("sync " + p_.event_name(id), start, true);
      throw;
    }
    host_slice("sync " + p_.event_name(id), start, false);
  }

  /// Why device `d` has not finished its work: the chain of waits that
  /// holds it (or what asking said).
  std::string why_busy(int d) const {
    try {
      b_.await(dev(d), clock::now());
      return "it has finished now";
    } catch (const timeout_error& t) {
      return t.chain();
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  void await_device(int d, bool forget) {
    auto start = trace_clock_ns();
    auto name = fmt::format("{} {}", forget ? "sync-device" : "await", d);
    try {
      try {
        bounded(name.c_str(), [&] { return settled(d); });
      } catch (const step_timeout& t) {
        throw step_timeout(fmt::format("{}: {}", t.what(), why_busy(d)));
      }
      if (forget)
        b_.sync_device(dev(d));
      else
        b_.await(dev(d));
    } catch (...) {
      host_slice(name, start, true);
      throw;
    }
    host_slice(name, start, false);
  }

  /// Refuses a wait of `ms` that the step timeout would cut short: "`what`
  /// of `ms` ms is longer than the step timeout".
  void check_fits_step(double ms, const char* what) const {
    if (ms > opts_.step_timeout_s * 1e3)
      throw std::invalid_argument(fmt::format("{} of {} ms is longer than the step timeout ({} s)",
                                              what, ms, opts_.step_timeout_s));
  }

  /// The work of a task item with the fault a `fail-at EV` or `delay-at EV`
  /// aimed at it: throwing its message instead, or sleeping first.
  std::function<void()> faulted(const step& st, std::function<void()> work) const {
    if (st.fail_with) {
      auto msg = *st.fail_with;
      return [msg] { throw std::runtime_error(msg); };
    }
    if (st.held_ms > 0) {
      check_fits_step(st.held_ms, "delay-at: a delay");
      return [ms = st.held_ms, work = std::move(work)] {
        sleep_ms(ms);
        work();
      };
    }
    return work;
  }

  /// `(await-hold H)`: blocks until the device's runner is in hold H (so
  /// everything queued before it on the device has run), at most the step
  /// timeout; fails when the hold resolved without running (its device
  /// failed or cancelled it).
  void await_hold(const step& st) {
    const auto& latch = holds_[st.hold];
    const auto& name = p_.holds[st.hold];
    auto [d, idx] = hold_items_[st.hold];
    if (d < 0)
      throw std::runtime_error(fmt::format("await-hold: hold '{}' was never queued: the step "
                                           "that makes it failed",
                                           name));
    event e{dev(d).get_runner(), model_[d][idx].seq};
    auto start = trace_clock_ns();
    auto desc = "await-hold " + name;
    bool failed = false;
    try {
      bounded(desc.c_str(),
              [&] { return latch->entered.load() || b_.state(e) != event_state::pending; });
    } catch (...) {
      host_slice(desc, start, true);
      throw;
    }
    failed = !latch->entered.load();
    host_slice(desc, start, failed);
    if (failed)
      throw std::runtime_error(fmt::format("await-hold: hold '{}' on device {} {} without "
                                           "running",
                                           name, d, to_string(b_.state(e))));
  }

  /// `(cancel-at EV)`: the step that makes EV, its item cancelled alone. A
  /// hold queued before it blocks the device's runner; once the runner is
  /// in it (everything queued before has run), the step queues its item,
  /// `cancel` drops exactly that (the only work queued and not started),
  /// and the hold opens.
  void cancel_alone(const step& st) {
    auto latch = std::make_shared<hold_latch>();
    auto before = last_seq(st.device);
    auto desc = "cancel-at " + p_.event_name(st.as);
    b_.schedule_task(dev(st.device), {desc, [latch] { latch->hold(); }});
    add_item(st.device, before, "task", desc, -1, st);
    auto hold = b_.all_work(dev(st.device));
    struct opener {
      std::shared_ptr<hold_latch> l;
      ~opener() { l->release(); }
    } open{latch};
    // A hold that failed (the device failed before it) never runs: the
    // step then meets the failed device as it would without the fault.
    bounded(desc.c_str(),
            [&] { return latch->entered.load() || b_.state(hold) != event_state::pending; });
    execute_step(st);
    if (latch->entered.load())
      b_.cancel(dev(st.device));
  }

  void execute(const step& st) {
    if (st.as >= 0 && p_.event_timed(st.as))
      scheduled_ns_[st.as] = trace_clock_ns(); // (within EV T) measures from here
    if (st.cancel_here)
      cancel_alone(st);
    else
      execute_step(st);
    if (st.node_fault >= 0) {
      // (kill-node-at EV [NODE]) or (cut-node-at ...): right after the step
      // that makes EV, as a (kill-node NODE) written after it would.
      step stop;
      stop.kind = st.node_cut ? op::cut_node : op::kill_node;
      stop.host = st.node_fault;
      kill_node(stop);
    }
  }

  void execute_step(const step& st) {
    switch (st.kind) {
      case op::make_context:
        contexts_[st.ctx] = b_.make_context(dev(st.device));
        break;
      case op::make_child:
        contexts_[st.ctx] = b_.make_child(*contexts_[st.parent]);
        break;
      case op::alloc_node:
        for (int t : st.tnodes) {
          check_pool_room(st.device, st.ctx, t);
          contexts_[st.ctx] = b_.alloc_node(*contexts_[st.ctx], p_.tnodes[t]);
        }
        break;
      case op::alloc_pool:
        if (st.pool_id != 0 && st.pool_id < dev(st.device).next_pool_id()
            && !script_pools_[st.device].count(st.pool_id))
          throw std::invalid_argument(fmt::format(
            "pool {} of device {} holds a tnode's buffer (alloc, from-host and copy number their "
            "pools 1, 2, ...): give (pool ...) ids they do not reach, e.g. from 1000",
            st.pool_id, st.device));
        script_pools_[st.device].insert(st.pool_id);
        b_.alloc_pool(dev(st.device), static_cast<int>(st.pool_id),
                      static_cast<std::size_t>(st.bytes), static_cast<std::size_t>(st.align));
        break;
      case op::free_pool: {
        auto before = last_seq(st.device);
        b_.free_pool(dev(st.device), static_cast<int>(st.pool_id));
        add_item(st.device, before, "pool", fmt::format("free pool {}", st.pool_id), -1, st);
        break;
      }
      case op::memset: {
        auto before = last_seq(st.device);
        b_.memset_zero(dev(st.device), static_cast<int>(st.pool_id),
                       static_cast<std::size_t>(st.offset), static_cast<std::size_t>(st.bytes));
        add_item(st.device, before, "memset", fmt::format("memset pool {}", st.pool_id), st.as,
                 st);
        break;
      }
      case op::kernel:
        kernel(st);
        break;
      case op::wait: {
        auto c = ctx_of(st);
        auto before = last_seq(st.device);
        const auto& e = ev(st.ev);
        b_.will_wait_for(c, e);
        auto from = item_of_event(st.ev);
        if (from.first == st.device)
          break; // a wait on the device's own event is a no-op
        int idx = add_item(st.device, before, "gate",
                           fmt::format("wait for {}", p_.event_name(st.ev)), -1, st);
        add_edge(from, st.device, idx, "wait");
        break;
      }
      case op::all_work: {
        bind_event(st.as, b_.all_work(dev(st.device)));
        int n = static_cast<int>(model_[st.device].size());
        event_items_[st.as] = {n > 0 ? st.device : -1, n - 1};
        break;
      }
      case op::sync:
        sync_event(st.ev);
        break;
      case op::await:
        await_device(st.device, false);
        break;
      case op::sync_device:
        await_device(st.device, true);
        break;
      case op::from_host:
        from_host(st);
        break;
      case op::to_host: {
        const auto& t = p_.tnodes[st.tnodes[0]];
        auto& h = hosts_[st.host];
        h.assign(t.size_in_bytes / sizeof(float), 0.0f);
        auto before = last_seq(st.device);
        b_.to_host(*contexts_[st.ctx], t, std::as_writable_bytes(std::span{h}));
        host_done_[st.host] = b_.all_work(dev(st.device));
        int idx = add_item(st.device, before, "copy", "to_host " + t.label, -1, st);
        add_edge(writer(st.device, st.tnodes[0]), st.device, idx, "data");
        break;
      }
      case op::copy:
        copy(st);
        break;
      case op::cancel:
        b_.cancel(dev(st.device));
        break;
      case op::kill:
        kill(st);
        break;
      case op::recover:
        if (!b_.recover(dev(st.device)))
          throw std::runtime_error(fmt::format("recover: device {} had not failed (or was "
                                               "killed, which cannot be undone)",
                                               st.device));
        break;
      case op::delay: {
        check_fits_step(st.ms, "a delay");
        if (!dev(st.device).is_local()) {
          remote_delay(st);
          break;
        }
        auto before = last_seq(st.device);
        auto ms = st.ms;
        auto desc = fmt::format("delay {} ms", ms);
        b_.schedule_task(dev(st.device),
                         {desc, faulted(st, [ms] { sleep_ms(ms); })});
        add_item(st.device, before, "task", desc, st.as, st);
        break;
      }
      case op::hold: {
        auto before = last_seq(st.device);
        auto latch = holds_[st.hold];
        auto desc = "hold " + p_.holds[st.hold];
        // Open at (release ...), or at the end of the run at the latest.
        b_.schedule_task(dev(st.device), {desc, [latch] { latch->hold(); }});
        hold_items_[st.hold] = {st.device, add_item(st.device, before, "task", desc, -1, st)};
        break;
      }
      case op::await_hold:
        await_hold(st);
        break;
      case op::release:
        holds_[st.hold]->release();
        break;
      case op::sleep: {
        check_fits_step(st.ms, "a sleep");
        auto start = trace_clock_ns();
        sleep_ms(st.ms);
        host_slice(fmt::format("sleep {} ms", st.ms), start, false);
        break;
      }
      case op::sync_in:
        sync_in(st);
        break;
      case op::expect:
        expect(st);
        break;
      case op::kill_node:
      case op::cut_node:
        kill_node(st);
        break;
      case op::detach_node:
      case op::attach_node:
        detach_or_attach(st);
        break;
      case op::round:
        record_round(st);
        break;
      case op::replay:
        replay_round(st);
        break;
    }
  }

  /// Refuses to let `alloc`, `from-host` or `copy` give tnode `t` a pool
  /// whose id the script took with `(pool ...)`: the backend would replace it.
  void check_pool_room(int d, int ctx, int t) const {
    const auto& node = p_.tnodes[t];
    if (contexts_[ctx]->buffers.count(node) || dev(d).constant_buffer(node))
      return; // no new pool: held already, or a cached constant reused
    auto next = dev(d).next_pool_id();
    auto taken = script_pools_.find(d);
    if (taken != script_pools_.end() && taken->second.count(next))
      throw std::invalid_argument(fmt::format(
        "tnode '{}' would get pool {} of device {}, which a (pool ...) form took: give (pool "
        "...) ids that alloc, from-host and copy do not reach (they number pools 1, 2, ...), "
        "e.g. from 1000",
        p_.tnodes[t].label, next, d));
  }

  std::pair<int, int> writer(int d, int t) const {
    auto it = writers_.find({d, t});
    return it == writers_.end() ? std::pair{-1, -1} : it->second;
  }

  /// Item `idx` of device `d` writes tnode `t` there: as the runtime does,
  /// it waits for the copies on other devices still reading `t` from `d`
  /// (write-after-read edges, which carry no failure), and it is the last
  /// writer of `t` on `d` from now on.
  void writes(int d, int t, int idx) {
    if (idx < 0)
      return; // recorded, not run (recording_)
    if (auto it = readers_.find({d, t}); it != readers_.end()) {
      for (auto from : it->second)
        add_edge(from, d, idx, "war");
      readers_.erase(it);
    }
    writers_[{d, t}] = {d, idx};
  }

  /// `scale w 2`: the kernel and its arguments as the script gave them.
  static std::string describe_kernel(const step& st) {
    std::string out = st.kernel;
    for (const auto& a : st.args) {
      out += ' ';
      std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, tnode>)
            out += v.label;
          else if constexpr (std::is_same_v<T, std::string>)
            out += v;
          else
            out += fmt::format("{}", v);
        },
        a);
    }
    return out;
  }

  void kernel(const step& st) {
    // A task cannot be interrupted: one longer than a step may wait would
    // hold the run past every bound.
    if (st.kernel == "spin_ns" && static_cast<double>(std::get<int64_t>(st.args[0]))
                                    > opts_.step_timeout_s * 1e9)
      throw std::invalid_argument(fmt::format(
        "spin_ns {} is longer than the step timeout ({} s)", std::get<int64_t>(st.args[0]),
        opts_.step_timeout_s));
    auto c = ctx_of(st);
    if (!dev(st.device).is_local())
      return remote_kernel(st, c);
    auto r = b_.link(c, st.kernel, st.args);
    // Errors name the task as the script wrote it: "task 'scale w 2' failed".
    auto text = kernel_text(st);
    r.schedule.description = texts_[text];
    if (st.fail_with || st.held_ms > 0)
      r.schedule.work = faulted(st, std::move(r.schedule.work));
    auto before = last_seq(st.device);
    auto e = b_.run(r);
    int idx = add_item(st.device, before, "task", text, st.as, st);
    if (st.as >= 0)
      bind_event(st.as, e);
    auto def = find_kernel(st.kernel);
    for (int i : def->reads)
      if (auto* t = std::get_if<tnode>(&st.args[i]))
        add_edge(writer(st.device, t->id - 1), st.device, idx, "data");
    for (int i : def->writes)
      if (auto* t = std::get_if<tnode>(&st.args[i]))
        writes(st.device, t->id - 1, idx);
  }

  /// A kernel on a device of a node: a named task with the context's
  /// buffers (link and run need the device here).
  void remote_kernel(const step& st, const context& c) {
    task_spec spec{st.kernel, {}};
    for (const auto& a : st.args)
      std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, tnode>)
            spec.args.emplace_back(buffer_arg{c.buffers.at(v), v.size_in_bytes});
          else
            spec.args.emplace_back(v);
        },
        a);
    if (st.fail_with)
      spec = task_spec{"fail", {*st.fail_with}};
    auto before = last_seq(st.device);
    auto e = b_.schedule_named(dev(st.device), spec);
    add_item(st.device, before, "task", kernel_text(st), st.as, st);
    if (st.as >= 0)
      bind_event(st.as, e);
  }

  void from_host(const step& st) {
    const auto& t = p_.tnodes[st.tnodes[0]];
    auto& data = host_data_.emplace_back(t.size_in_bytes / sizeof(float));
    switch (st.data.how) {
      case host_data::kind::fill:
        std::fill(data.begin(), data.end(), static_cast<float>(st.data.value));
        break;
      case host_data::kind::iota:
        for (std::size_t i = 0; i < data.size(); ++i)
          data[i] = static_cast<float>(st.data.value + static_cast<double>(i));
        break;
      case host_data::kind::values:
        data = st.data.values;
        break;
    }
    check_pool_room(st.device, st.ctx, st.tnodes[0]);
    auto before = last_seq(st.device);
    contexts_[st.ctx] = b_.init_from_host(*contexts_[st.ctx], t, std::as_bytes(std::span{data}));
    int idx = add_item(st.device, before, "copy", "from_host " + t.label, st.as, st);
    if (model_[st.device][idx].seq != 0) // not a cached constant, which is not written again
      writes(st.device, st.tnodes[0], idx);
  }

  void copy(const step& st) {
    const auto& t = p_.tnodes[st.tnodes[0]];
    int src_dev = contexts_[st.ctx2]->device.ordinal();
    auto before = last_seq(st.device);
    std::string desc;
    if (st.into_merge) {
      auto r = b_.device_to_device(t, merge_buffer_use::copy, *contexts_[st.ctx], *contexts_[st.ctx2]);
      if (!r)
        throw std::invalid_argument(fmt::format("copy: a context lacks tnode '{}'", t.label));
      contexts_[st.ctx] = r->context;
      desc = fmt::format("copy {} from {} into merge", t.label, src_dev);
    } else if (recording_) {
      // In a round: into the buffer record_round gave the destination.
      if (!b_.device_to_device(t, merge_buffer_use::no, *contexts_[st.ctx], *contexts_[st.ctx2]))
        throw std::invalid_argument(fmt::format("copy: a context lacks tnode '{}'", t.label));
      desc = fmt::format("copy {} from {}", t.label, src_dev);
    } else {
      check_pool_room(st.device, st.ctx, st.tnodes[0]);
      contexts_[st.ctx] = b_.init_from_device(t, *contexts_[st.ctx], *contexts_[st.ctx2]);
      desc = fmt::format("copy {} from {}", t.label, src_dev);
    }
    int idx = add_item(st.device, before, "copy", desc, st.as, st);
    add_edge(writer(src_dev, st.tnodes[0]), st.device, idx, "copy");
    // A copy into the merge buffer writes no tnode of its device.
    if (!st.into_merge)
      writes(st.device, st.tnodes[0], idx);
    if (src_dev != st.device && idx >= 0)
      readers_[{src_dev, st.tnodes[0]}].push_back({st.device, idx});
  }

  void kill(const step& st) {
    auto start = trace_clock_ns();
    auto a = device_actor_of(b_, dev(st.device));
    caf::scoped_actor self{b_.system()};
    self->monitor(a);
    // An exit message with the script's reason (anon_send_exit takes only
    // an exit_reason).
    a->enqueue(nullptr, caf::make_message_id(),
               caf::make_message(caf::exit_msg{a->address(),
                                               caf::make_error(caf::sec::runtime_error,
                                                               st.message)}),
               nullptr);
    bool down = false;
    self->receive([&](caf::down_msg&) { down = true; },
                  caf::after(std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::duration<double>(opts_.step_timeout_s)))
                    >> [] {});
    host_slice(fmt::format("kill {}", st.device), start, !down);
    if (!down)
      throw step_timeout(fmt::format("kill {}: the device's actor did not stop within {} s",
                                     st.device, opts_.step_timeout_s));
  }

  // -- rounds ------------------------------------------------------------------

  /// A `(round ...)` as recorded: the round, and per body step (one item
  /// each) its recorded event and its description in the model.
  struct recorded_round {
    multidev::round r;
    std::vector<event> made;
    std::vector<uint32_t> texts;
  };

  /// What a body step's item is called: its description as the step would
  /// give it outside a round (the item's name in failure texts, unless an
  /// `(as EV)` names it).
  std::string describe_body_step(const step& st) {
    switch (st.kind) {
      case op::kernel:
        return texts_[kernel_text(st)];
      case op::memset:
        return fmt::format("memset pool {}", st.pool_id);
      case op::delay:
        return fmt::format("delay {} ms", st.ms);
      case op::wait:
        return "wait for " + p_.event_name(st.ev);
      case op::copy:
        return fmt::format("copy {} from {}{}", p_.tnodes[st.tnodes[0]].label,
                           contexts_[st.ctx2]->device.ordinal(),
                           st.into_merge ? " into merge" : "");
      default:
        return st.text;
    }
  }

  /// `(round NAME ...)`: records its body through `backend::record`, each
  /// step one item; nothing runs. Its events name the items until a replay
  /// makes them (replay_round).
  void record_round(const step& st) {
    const auto& rd = p_.rounds[static_cast<std::size_t>(st.host)];
    // A copy records device_to_device into the destination's buffer, which
    // it gets now (an allocation is no item a replay repeats). A copy into
    // a merge buffer too small for it (none yet) makes it now, with one
    // copy of the node, an item of this step: the round's add_from_merge
    // links against it, and a replayed copy that grew it would replace it
    // under that kernel.
    for (const auto& b : rd.body)
      if (b.kind == op::copy && b.into_merge) {
        const auto& t = p_.tnodes[b.tnodes[0]];
        if (dev(b.device).merge_buffer_capacity() >= t.size_in_bytes)
          continue;
        auto before = last_seq(b.device);
        if (!b_.device_to_device(t, merge_buffer_use::copy, *contexts_[b.ctx], *contexts_[b.ctx2]))
          throw refused_in_round(b.where, fmt::format("copy: a context lacks tnode '{}'", t.label));
        add_item(b.device, before, "copy",
                 fmt::format("copy {} from {} into merge (makes the merge buffer of round {})",
                             t.label, contexts_[b.ctx2]->device.ordinal(), rd.name),
                 -1, st);
      } else if (b.kind == op::copy) {
        const auto& t = p_.tnodes[b.tnodes[0]];
        if (!contexts_[b.ctx]->buffers.count(t)) {
          check_pool_room(b.device, b.ctx, b.tnodes[0]);
          contexts_[b.ctx] = b_.alloc_node(*contexts_[b.ctx], t);
        }
      }
    recorded_round rr;
    rr.made.resize(rd.body.size());
    {
      recording_ = true;
      struct done {
        bool& f;
        ~done() { f = false; }
      } guard{recording_};
      rr.r = b_.record(rd.name, [&] {
        for (std::size_t j = 0; j < rd.body.size(); ++j) {
          const auto& b = rd.body[j];
          try {
            execute_step(b);
          } catch (const std::invalid_argument& e) {
            throw refused_in_round(b.where, fmt::format("in round '{}': {}", rd.name, e.what()));
          } catch (const std::exception& e) {
            throw std::runtime_error(fmt::format("in round '{}', {}: {}", rd.name, b.text,
                                                 e.what()));
          }
          rr.made[j] = b_.all_work(dev(b.device)); // the item it recorded
          if (b.as >= 0)
            events_[b.as] = rr.made[j];
        }
      });
    }
    for (const auto& b : rd.body)
      if (b.as >= 0) {
        events_[b.as].reset(); // made by the replays
        event_items_[b.as] = {-1, -1};
      }
    if (rr.r.size() != rd.body.size())
      throw std::logic_error(fmt::format("round '{}' recorded {} items for {} steps", rd.name,
                                         rr.r.size(), rd.body.size()));
    rr.texts.reserve(rd.body.size());
    for (std::size_t j = 0; j < rd.body.size(); ++j) {
      const auto& b = rd.body[j];
      auto desc = describe_body_step(b);
      rr.r.name_item(rr.made[j], b.as >= 0 ? p_.event_name(b.as) : desc);
      rr.texts.push_back(intern(fmt::format("{} (round {})", desc, rd.name)));
    }
    rounds_[static_cast<std::size_t>(st.host)] = std::move(rr);
  }

  /// `(replay NAME N)`: N replays, one after the other; each item goes into
  /// the model with its replay's number, and the round's events become the
  /// latest replay's.
  void replay_round(const step& st) {
    const auto& rd = p_.rounds[static_cast<std::size_t>(st.host)];
    auto& rr = rounds_[static_cast<std::size_t>(st.host)];
    if (!rr)
      throw std::runtime_error(fmt::format("replay: round '{}' was never recorded: its (round "
                                           "...) step at {}:{} failed",
                                           rd.name, rd.where.line, rd.where.column));
    std::vector<uint64_t> prev(static_cast<std::size_t>(p_.devices), 0);
    std::vector<bool> known(static_cast<std::size_t>(p_.devices), false);
    for (uint64_t k = 0; k < st.times && !stopped_; ++k) {
      for (const auto& b : rd.body)
        if (!known[b.device]) {
          prev[b.device] = last_seq(b.device);
          known[b.device] = true;
        }
      auto now = trace_clock_ns();
      for (const auto& b : rd.body)
        if (b.as >= 0 && p_.event_timed(b.as))
          scheduled_ns_[b.as] = now; // (within EV T) measures from the replay
      auto evs = b_.replay(rr->r);
      auto n = static_cast<uint32_t>(rr->r.replays());
      for (std::size_t j = 0; j < rd.body.size(); ++j)
        model_replayed(rd.body[j], evs.item(j), prev, n, rr->texts[j]);
    }
  }

  /// Item `e` of replay `n`, made by body step `st`, into the model, as the
  /// step outside a round would have put it there. `prev`: each device's
  /// last seq so far.
  void model_replayed(const step& st, const event& e, std::vector<uint64_t>& prev, uint32_t n,
                      uint32_t text) {
    int d = st.device;
    uint64_t seq = e.seq();
    auto add = [&](const char* kind) {
      uint64_t s = seq > prev[d] ? seq : 0;
      prev[d] = std::max(prev[d], seq);
      model_[d].push_back(model_item{s, next_order_++, &st, text, st.as, st.where.line, n, kind});
      return static_cast<int>(model_[d].size()) - 1;
    };
    int idx = -1;
    switch (st.kind) {
      case op::kernel: {
        idx = add("task");
        auto def = find_kernel(st.kernel);
        for (int i : def->reads)
          if (auto* t = std::get_if<tnode>(&st.args[i]))
            add_edge(writer(d, t->id - 1), d, idx, "data");
        for (int i : def->writes)
          if (auto* t = std::get_if<tnode>(&st.args[i]))
            writes(d, t->id - 1, idx);
        break;
      }
      case op::delay:
        idx = add("task");
        break;
      case op::memset:
        idx = add("memset");
        break;
      case op::copy: {
        idx = add("copy");
        int src_dev = contexts_[st.ctx2]->device.ordinal();
        add_edge(writer(src_dev, st.tnodes[0]), d, idx, "copy");
        if (!st.into_merge)
          writes(d, st.tnodes[0], idx);
        if (src_dev != d)
          readers_[{src_dev, st.tnodes[0]}].push_back({d, idx});
        break;
      }
      case op::wait: {
        auto from = item_of_event(st.ev);
        if (from.first == d) {
          prev[d] = std::max(prev[d], seq); // a no-op, as outside a round
          break;
        }
        idx = add("gate");
        add_edge(from, d, idx, "wait");
        break;
      }
      default:
        break;
    }
    if (st.as >= 0) {
      bind_event(st.as, e);
      event_items_[st.as] = {d, idx};
    }
  }

  // -- expectations ------------------------------------------------------------

  void record(const step& st, bool held, std::string observed) {
    result_.expectations.push_back(
      expectation_result{st.where, st.text, held, std::move(observed)});
  }

  static bool close(double got, double want, double tol) {
    return std::abs(got - want) <= tol * std::max(1.0, std::abs(want));
  }

  void expect(const step& st) {
    try {
      evaluate(st);
    } catch (const step_timeout& e) {
      record(st, false, e.what());
      stopped_ = true;
    } catch (const device_error& e) {
      // What the expectation looks at failed (a checksum's item threw): the
      // expectation did not hold, and it saw the failure.
      saw(e);
      record(st, false, std::string{"failed: "} + e.what());
    } catch (const std::exception& e) {
      // An event was never made: the expectation did not hold.
      record(st, false, std::string{"failed: "} + e.what());
    }
  }

  void evaluate(const step& st) {
    switch (st.what) {
      case subject::action:
        return expect_action(st);
      case subject::state: {
        const auto& e = ev(st.ev);
        if (st.state != "pending")
          bounded("the event", [&] { return b_.state(e) != event_state::pending; });
        saw_failure_of(e);
        auto got = to_string(b_.state(e));
        return record(st, got == st.state, got);
      }
      case subject::before:
      case subject::overlap:
      case subject::after:
      case subject::within:
      case subject::concurrency:
        // Needs the traces: checked at the end, reported in its place.
        deferred_.emplace_back(&st, result_.expectations.size());
        record(st, false, "not checked");
        return;
      case subject::resolved: {
        // At once, without waiting: the event's state now.
        auto got = b_.state(ev(st.ev));
        bool resolved = got != event_state::pending;
        return record(st, resolved == (st.pred == predicate::is_true),
                      resolved ? fmt::format("resolved: {}", to_string(got)) : "pending");
      }
      case subject::idle: {
        bool idle = b_.is_idle(dev(st.device));
        return record(st, idle == (st.pred == predicate::is_true), idle ? "idle" : "busy");
      }
      case subject::memory: {
        auto got = static_cast<int64_t>(b_.get_used_memory(dev(st.device)));
        bool held = st.cmp == "="    ? got == st.number
                    : st.cmp == "<=" ? got <= st.number
                    : st.cmp == ">=" ? got >= st.number
                    : st.cmp == "<"  ? got < st.number
                                     : got > st.number;
        return record(st, held, fmt::format("{} bytes", got));
      }
      case subject::checksum: {
        sync_event(st.ev);
        auto d = event_items_[st.ev].first;
        auto r = d >= 0 ? b_.result(dev(d), p_.event_name(st.ev))
                        : b_.result(p_.event_name(st.ev));
        if (!r)
          return record(st, false, "no result was published");
        bool held = true;
        if (st.sum)
          held = held && close(r->sum, *st.sum, st.tolerance);
        if (st.count)
          held = held && static_cast<int64_t>(r->count) == *st.count;
        return record(st, held, fmt::format("(sum {}) (count {}) (hash {})", r->sum, r->count,
                                            r->hash));
      }
      case subject::host:
        return expect_host(st);
    }
  }

  void expect_host(const step& st) {
    if (!host_done_[st.host])
      return record(st, false, "the to-host copy never ran");
    const auto& done = *host_done_[st.host];
    bounded("the to-host copy", [&] { return b_.state(done) != event_state::pending; });
    saw_failure_of(done);
    if (b_.state(done) != event_state::done)
      return record(st, false, fmt::format("the to-host copy did not complete ({})",
                                           to_string(b_.state(done))));
    const auto& h = hosts_[st.host];
    double sum = 0;
    for (float x : h)
      sum += x;
    std::vector<std::string> bad;
    if (st.sum && !close(sum, *st.sum, st.tolerance))
      bad.push_back(fmt::format("sum {}", sum));
    if (st.all)
      for (std::size_t i = 0; i < h.size(); ++i)
        if (!close(h[i], *st.all, st.tolerance)) {
          bad.push_back(fmt::format("element {} is {}", i, h[i]));
          break;
        }
    if (st.at) {
      auto [i, v] = *st.at;
      if (i < 0 || static_cast<std::size_t>(i) >= h.size())
        bad.push_back(fmt::format("index {} is outside the {} elements", i, h.size()));
      else if (!close(h[i], v, st.tolerance))
        bad.push_back(fmt::format("element {} is {}", i, h[i]));
    }
    if (st.expect_values) {
      const auto& want = *st.expect_values;
      if (want.size() != h.size())
        bad.push_back(fmt::format("{} elements, expected {}", h.size(), want.size()));
      else
        for (std::size_t i = 0; i < h.size(); ++i)
          if (!close(h[i], want[i], st.tolerance)) {
            bad.push_back(fmt::format("element {} is {}", i, h[i]));
            break;
          }
    }
    if (bad.empty())
      return record(st, true, fmt::format("{} elements, sum {}", h.size(), sum));
    std::string obs;
    for (const auto& x : bad)
      obs += (obs.empty() ? "" : "; ") + x;
    record(st, false, obs);
  }

  void expect_action(const step& st) {
    std::optional<std::string> error;
    std::optional<device_error> derr;
    bool cancellation = false;
    try {
      execute(*st.action);
    } catch (const step_timeout& e) {
      never_made(*st.action);
      record(st, false, e.what());
      stopped_ = true;
      return;
    } catch (const device_error& e) {
      saw(e);
      derr.emplace(e);
      cancellation = dynamic_cast<const cancelled_error*>(&e) != nullptr;
      error = e.what();
    } catch (const std::exception& e) {
      error = e.what();
    }
    // An action that failed before making its event, expected or not: a
    // `(sync-in ...)` task waiting for that event learns it at once.
    if (error)
      never_made(*st.action);
    if (st.pred == predicate::ok)
      return record(st, !error, error ? "failed: " + *error : "ok");
    if (!error)
      return record(st, false, "it succeeded");
    std::vector<std::string> bad;
    check_failure(st, *error, derr ? &*derr : nullptr, cancellation, bad);
    std::string obs = "failed: " + *error;
    for (const auto& x : bad)
      obs += "; " + x;
    record(st, bad.empty(), obs);
  }

  void check_failure(const step& st, const std::string& what, const device_error* de,
                     bool cancellation, std::vector<std::string>& bad) {
    if (st.matches && !std::regex_search(what, std::regex{*st.matches, matches_syntax}))
      bad.push_back(fmt::format("the message does not match \"{}\"", *st.matches));
    if (st.origin) {
      auto want = dev(*st.origin).name();
      if (!de)
        bad.push_back("not a device error, so it has no origin");
      else if (de->origin_device() != want)
        bad.push_back(fmt::format("it started on {}, not {}", de->origin_device(), want));
    }
    if (st.task) {
      if (!de)
        bad.push_back("not a device error, so it has no origin task");
      else if (de->origin_task() != *st.task)
        bad.push_back(fmt::format("its origin task is '{}', not '{}'", de->origin_task(),
                                  *st.task));
    }
    if (st.cancelled && !cancellation)
      bad.push_back("it was not a cancellation");
  }

  // -- the end -----------------------------------------------------------------

  void release_holds() {
    for (auto& h : holds_)
      if (h)
        h->release();
    for (auto& s : slots_)
      if (s)
        s->close();
  }

  /// Stops the nodes the run started (SIGTERM); one that does not exit with
  /// status 0 (a crash, a sanitizer's report at exit) is an unexpected
  /// failure. Nodes the script killed are gone already.
  void stop_nodes() {
    for (auto& [name, node] : spawned_) {
      if (!node->running())
        continue;
      auto status = node->terminate();
      if (status != 0)
        result_.unexpected.push_back(expectation_result{
          location{p_.file, 0, 0}, "(end of run)", false,
          status < 0 ? fmt::format("node {} did not exit within 30 s of SIGTERM", name)
                     : fmt::format("node {} exited with status {} when stopped at the end of "
                                   "the run; its stderr ends:\n{}",
                                   name, status, node->errors())});
    }
  }

  /// Releases the holds, lets every device finish, then checks what needed
  /// the whole run (order, DAG edges) against the devices' traces.
  void finish() {
    release_holds();
    for (int d = 0; d < p_.devices; ++d) {
      auto deadline = clock::now() + std::chrono::duration<double>(opts_.step_timeout_s);
      while (!settled(d) && clock::now() < deadline)
        std::this_thread::sleep_for(200us);
      if (!settled(d))
        result_.unexpected.push_back(expectation_result{
          location{p_.file, 0, 0}, fmt::format("(end of run)"), false,
          fmt::format("device {} was still busy {} s after the last step", d,
                      opts_.step_timeout_s)});
    }
    for (int d = 0; d < p_.devices; ++d) {
      auto t = trace_now(d);
      // A device of a node that is gone: what it did until the script
      // killed the node, if it did, and its loss as this process saw it.
      if (!t.unreachable.empty())
        if (auto it = last_traces_.find(d); it != last_traces_.end()) {
          auto host = std::move(t.host);
          t = it->second;
          t.host = std::move(host);
        }
      traces_.push_back(std::move(t));
      result_.dropped_records += traces_.back().dropped;
    }
    for (auto [st, slot] : deferred_) {
      result_.expectations[slot] =
        st->what == subject::before ? expect_before(*st) : expect_timed(*st);
      for (int id : {st->ev, st->ev2})
        if (id >= 0 && events_[id])
          saw_failure_of(*events_[id]);
    }
    for (const auto& dag : p_.dags)
      check_dag(dag);
    unexpected_items();
  }

  // -- failures no expectation saw ---------------------------------------------

  /// Where a failure started, as its cause says (the kind, the device, the
  /// task, its seq and the original message): every item that failed from
  /// it, here or on a device that waited, has the same.
  using origin = std::tuple<int, std::string, std::string, uint64_t, std::string>;

  static origin origin_of(const failure& f) {
    return {static_cast<int>(f.origin_kind), f.device, f.task, f.seq, f.message};
  }

  /// An expectation (or a step reported as an unexpected failure) saw `e`:
  /// the items that failed from its origin are accounted for.
  void saw(const device_error& e) { seen_.insert(origin_of(e.cause())); }

  /// `saw` the failure of `e` if it failed or was cancelled.
  void saw_failure_of(const event& e) {
    try {
      auto s = b_.state(e);
      if (s == event_state::failed || s == event_state::cancelled)
        b_.sync(e, clock::now());
    } catch (const device_error& x) {
      saw(x);
    } catch (const std::exception&) {
      // No cause to learn (a node that is gone): nothing seen.
    }
  }

  /// Every item of the script that failed or was cancelled and whose origin
  /// no expectation saw is an unexpected failure, named with its device and
  /// error, in script order (docs/scenarios.md, "Expected failures").
  void unexpected_items() {
    // Each device's items are in script order: merged, without a copy.
    std::vector<std::size_t> next(static_cast<std::size_t>(p_.devices));
    for (int d = 0; d < p_.devices; ++d)
      next[d] = judged_upto(d);
    for (;;) {
      int first = -1;
      for (int d = 0; d < p_.devices; ++d) {
        while (next[d] < model_[d].size() && model_[d][next[d]].seq == 0)
          ++next[d];
        if (next[d] < model_[d].size()
            && (first < 0 || model_[d][next[d]].order < model_[first][next[first]].order))
          first = d;
      }
      if (first < 0)
        break;
      judge_item(first, next[first]++, traces_[first]);
    }
  }

  /// Items of device `d` before this index were judged when their session
  /// ended (`close_books`).
  std::size_t judged_upto(int d) const {
    auto it = judged_upto_.find(d);
    return it == judged_upto_.end() ? 0 : it->second;
  }

  /// Node `n`'s session ends here (`detach`, or `attach` after a loss): the
  /// items its devices took so far are judged now, from their traces as
  /// they are (or as read before the node was cut or killed), since the
  /// next session's seqs start at 1 again.
  void close_books(const node_decl& n) {
    for (int d = n.first; d < n.first + n.devices; ++d) {
      auto t = trace_now(d);
      if (!t.unreachable.empty())
        if (auto it = last_traces_.find(d); it != last_traces_.end())
          t = it->second;
      last_traces_.erase(d);
      for (std::size_t i = judged_upto(d); i < model_[d].size(); ++i)
        if (model_[d][i].seq != 0)
          judge_item(d, i, t);
      judged_upto_[d] = model_[d].size();
    }
  }

  /// Reports item `i` of device `d` if it failed (or was lost) and no
  /// expectation saw its origin; `t`: the device's trace.
  void judge_item(int d, std::size_t i, const device_trace& t) {
    {
      const auto& it = model_[d][i];
      const auto& rs = t.records;
      auto r = std::lower_bound(rs.begin(), rs.end(), it.seq,
                                [](const trace_record& x, uint64_t s) { return x.seq < s; });
      if (r != rs.end() && r->seq == it.seq && !r->failed && r->kind != trace_kind::cancel)
        return; // its trace says it did (no question to a node)
    }
    {
      const auto& it = model_[d][i];
      event e{dev(d).get_runner(), it.seq};
      std::string how = "failed";
      std::string what;
      try {
        auto s = outcome_of(e, dev(d).is_local());
        if (s != event_state::failed && s != event_state::cancelled)
          return; // done, or pending (finish reported the device busy)
        if (s == event_state::cancelled)
          how = "cancelled";
        try {
          b_.sync(e, clock::now() + (dev(d).is_local() ? 0s : answer_within));
          return;
        } catch (const device_error& x) {
          if (seen_.count(origin_of(x.cause())))
            return;
          // A node's device refuses a step after it failed with its name and
          // message only (no task, no seq): that refusal, seen, accounts for
          // the items that failed on it.
          if (!dev(d).is_local() && saw_device_failure(dev(d).name()))
            return;
          what = x.what();
        }
      } catch (const std::exception& x) {
        // Its device cannot answer any more (its node is gone) and the
        // trace does not show it done: it was lost with the node, which an
        // expectation that saw the device itself fail (a device that waited
        // on it) accounts for.
        if (saw_device_failure(dev(d).name()))
          return;
        how = "lost";
        what = x.what();
      }
      result_.unexpected.push_back(
        expectation_result{it.source->where, item_text(it), false,
                           fmt::format("{} on device {}: {}", how, d, what)});
    }
  }

  /// How long a node's device gets to answer for an item of a settled device.
  static constexpr std::chrono::seconds answer_within{10};

  /// How `e` ended. On a node's device `state` says what this process has
  /// heard (it never waits), so an item not heard of is asked, with a
  /// bounded sync: its device has settled, so the answer is a round trip away.
  event_state outcome_of(const event& e, bool local) const {
    auto s = b_.state(e);
    if (s != event_state::pending || local)
      return s;
    try {
      b_.sync(e, clock::now() + answer_within);
      return event_state::done;
    } catch (const cancelled_error&) {
      return event_state::cancelled;
    } catch (const device_error&) {
      return event_state::failed;
    } catch (const timeout_error&) {
      return event_state::pending;
    }
  }

  /// Whether device `d`'s trace shows its item `seq` run to the end.
  bool ran(int d, uint64_t seq) const {
    const auto* r = record_at(d, seq);
    return r && !r->failed && r->kind != trace_kind::cancel;
  }

  /// Whether an expectation saw a failure of the device `name` itself (not
  /// of one of its tasks): killed, or its node lost.
  bool saw_device_failure(const std::string& name) const {
    return std::any_of(seen_.begin(), seen_.end(), [&](const origin& o) {
      return std::get<1>(o) == name && std::get<2>(o).empty();
    });
  }

  /// The record of an event's item, or nullptr.
  const trace_record* record_of(int id) const {
    if (!events_[id])
      return nullptr;
    auto [d, item] = event_items_[id];
    if (d < 0)
      return nullptr;
    return record_at(d, events_[id]->seq());
  }

  /// The record of device `d`'s item `seq` in its trace, or nullptr.
  const trace_record* record_at(int d, uint64_t seq) const {
    const auto& rs = traces_[d].records;
    auto it = std::lower_bound(rs.begin(), rs.end(), seq,
                               [](const trace_record& r, uint64_t s) { return r.seq < s; });
    return it != rs.end() && it->seq == seq ? &*it : nullptr;
  }

  expectation_result expect_before(const step& st) const {
    auto* a = record_of(st.ev);
    auto* b = record_of(st.ev2);
    const auto& an = p_.event_name(st.ev);
    const auto& bn = p_.event_name(st.ev2);
    auto result = [&](bool held, std::string observed) {
      return expectation_result{st.where, st.text, held, std::move(observed)};
    };
    if (!a || !b)
      return result(false, fmt::format("no trace record of {}", !a ? an : bn));
    bool ran_a = a->kind != trace_kind::cancel && !a->failed;
    bool ran_b = b->kind != trace_kind::cancel;
    if (!ran_a || !ran_b)
      return result(false, fmt::format("{} did not run", !ran_a ? an : bn));
    return result(a->end_ns <= b->start_ns,
                  fmt::format("{} ended at {} ns, {} started at {} ns", an, a->end_ns - start_,
                              bn, b->start_ns - start_));
  }

  /// A duration for an observed value: `2.513 ms`, `40 us`, `-120 ns`.
  static std::string span(int64_t ns) {
    auto a = ns < 0 ? -ns : ns;
    if (a >= 1'000'000)
      return fmt::format("{:.3f} ms", static_cast<double>(ns) / 1e6);
    if (a >= 1'000)
      return fmt::format("{:.3f} us", static_cast<double>(ns) / 1e3);
    return fmt::format("{} ns", ns);
  }

  /// The record of a time assertion's item (event `ev`, else hold `hold`)
  /// and its name; nullptr when it has none.
  std::pair<const trace_record*, std::string> timed_record(int ev, int hold) const {
    if (ev >= 0)
      return {record_of(ev), p_.event_name(ev)};
    auto [d, idx] = hold_items_[hold];
    if (d < 0)
      return {nullptr, p_.holds[hold]};
    return {record_at(d, model_[d][idx].seq), p_.holds[hold]};
  }

  /// `overlap`, `after`, `within` and `concurrency`, on the traces' clock.
  expectation_result expect_timed(const step& st) const {
    auto result = [&](bool held, std::string observed) {
      return expectation_result{st.where, st.text, held, std::move(observed)};
    };
    if (st.what == subject::concurrency)
      return result_of_concurrency(st);
    if (st.what == subject::within) {
      const auto& n = p_.event_name(st.ev);
      auto* r = record_of(st.ev);
      if (scheduled_ns_[st.ev] < 0 || !events_[st.ev])
        return result(false, fmt::format("the step that makes {} did not run", n));
      if (!r)
        return result(false, fmt::format("no trace record of {}", n));
      auto took = r->end_ns - scheduled_ns_[st.ev];
      return result(took <= *st.at_most,
                    fmt::format("{} resolved {} after its step began (the step at {} ns, "
                                "{} resolved at {} ns)",
                                n, span(took), scheduled_ns_[st.ev] - start_, n,
                                r->end_ns - start_));
    }
    auto [a, an] = timed_record(st.ev, st.hold);
    auto [b, bn] = timed_record(st.ev2, st.hold2);
    if (!a || !b)
      return result(false, fmt::format("no trace record of {}", !a ? an : bn));
    if (a->kind == trace_kind::cancel || b->kind == trace_kind::cancel)
      return result(false, fmt::format("{} did not run (cancelled)",
                                       a->kind == trace_kind::cancel ? an : bn));
    if (st.what == subject::overlap) {
      auto common = std::min(a->end_ns, b->end_ns) - std::max(a->start_ns, b->start_ns);
      return result(common > 0,
                    fmt::format("{} ran {} to {} ns, {} ran {} to {} ns: {}", an,
                                a->start_ns - start_, a->end_ns - start_, bn,
                                b->start_ns - start_, b->end_ns - start_,
                                common > 0 ? fmt::format("they overlap {}", span(common))
                                           : fmt::format("{} apart", span(-common))));
    }
    // after: A started no earlier than B ended (plus at-least), and at most
    // at-most after it.
    auto gap = a->start_ns - b->end_ns;
    bool held = gap >= st.at_least.value_or(0) && (!st.at_most || gap <= *st.at_most);
    return result(held, fmt::format("{} started {} {} {} ended ({} started at {} ns, {} ended "
                                    "at {} ns)",
                                    an, span(gap < 0 ? -gap : gap),
                                    gap < 0 ? "before" : "after", bn, an,
                                    a->start_ns - start_, bn, b->end_ns - start_));
  }

  /// `(concurrency DEVICES ...)`: the most of the devices busy at once over
  /// the run. A device is busy while one of its slices of kind task, copy
  /// or memset runs (a gate waits, a cancel did not run, a pool release
  /// does no work); slices are half-open, [start, end).
  expectation_result result_of_concurrency(const step& st) const {
    std::vector<std::tuple<int64_t, int, int>> edges; // (time, -1 end / +1 start, device)
    for (int d : st.devs)
      for (const auto& r : traces_[d].records)
        if (r.kind == trace_kind::task || r.kind == trace_kind::copy
            || r.kind == trace_kind::memset) {
          edges.emplace_back(r.start_ns, +1, d);
          edges.emplace_back(r.end_ns, -1, d);
        }
    std::sort(edges.begin(), edges.end());
    std::map<int, int> running; // per device: slices running now
    int busy = 0, most = 0;
    int64_t when = 0;
    std::vector<int> which;
    for (auto [t, delta, d] : edges) {
      int& n = running[d];
      if (delta > 0 && n++ == 0)
        ++busy;
      else if (delta < 0 && --n == 0)
        --busy;
      if (busy > most) {
        most = busy;
        when = t;
        which.clear();
        for (auto [dd, k] : running)
          if (k > 0)
            which.push_back(dd);
      }
    }
    bool held = most >= st.at_least.value_or(0) && most <= st.at_most.value_or(most);
    std::string devs;
    for (int d : which)
      devs += (devs.empty() ? "" : " ") + std::to_string(d);
    return expectation_result{
      st.where, st.text, held,
      most == 0 ? std::string{"no item ran on those devices"}
                : fmt::format("at most {} of the {} device(s) busy at once, first at {} ns "
                              "(devices {})",
                              most, st.devs.size(),
                              when - start_, devs)};
  }

  void check_dag(const dag_decl& dag) {
    std::size_t checked = 0;
    std::string bad;
    for (auto [from, to] : dag.edges) {
      if (reached(dag, from) || reached(dag, to))
        continue; // a fault fails one of them (check_dag_faults)
      auto* a = record_of(dag.events[from]);
      auto* b = record_of(dag.events[to]);
      if (!a || !b || a->kind == trace_kind::cancel || b->kind == trace_kind::cancel
          || a->failed || b->failed) {
        // The expectation looks at every task: it saw their failures.
        for (int id : {dag.events[from], dag.events[to]})
          if (events_[id])
            saw_failure_of(*events_[id]);
        if (bad.empty())
          bad = fmt::format("{}.{} -> {}.{}: a task has no record or did not run", dag.name,
                            from, dag.name, to);
        continue;
      }
      ++checked;
      if (a->end_ns > b->start_ns && bad.empty())
        bad = fmt::format("{}.{} ended at {} ns, after {}.{} started at {} ns", dag.name, from,
                          a->end_ns - start_, dag.name, to, b->start_ns - start_);
    }
    result_.expectations.push_back(expectation_result{
      dag.where, fmt::format("(random-dag {}): every edge respected", dag.name), bad.empty(),
      bad.empty() ? fmt::format("{} tasks, {} edges, all in order", dag.events.size(), checked)
                  : bad});
    if (!dag.faults.empty())
      check_dag_faults(dag);
    if (!dag.hosts.empty())
      check_dag_data(dag);
  }

  /// Whether a fault of the DAG reaches task `i` (it must fail).
  static bool reached(const dag_decl& dag, int i) {
    return !dag.reached_by.empty() && dag.reached_by[static_cast<std::size_t>(i)] != 0;
  }

  /// `(faults K)`: every task a fault reaches failed, from one of those
  /// faults (its error's message names it), and every other task is done.
  void check_dag_faults(const dag_decl& dag) {
    std::string bad;
    std::size_t poisoned = 0;
    // Every task is looked at (its failure seen), the first wrong one told.
    auto tell = [&bad](std::string what) {
      if (bad.empty())
        bad = std::move(what);
    };
    for (std::size_t i = 0; i < dag.events.size(); ++i) {
      auto task = fmt::format("{}.{}", dag.name, i);
      auto mask = dag.reached_by[i];
      // Its error, if it failed: the step refused, or its event failed.
      std::optional<std::string> error;
      std::string state = "never made";
      auto refused = dag_refused_.find({static_cast<int>(&dag - p_.dags.data()),
                                        static_cast<int>(i)});
      if (refused != dag_refused_.end()) {
        error = refused->second;
        state = "refused";
      } else if (const auto& e = events_[dag.events[i]]) {
        auto s = b_.state(*e);
        state = to_string(s);
        if (s == event_state::failed || s == event_state::cancelled) {
          try {
            b_.sync(*e, clock::now());
          } catch (const device_error& x) {
            saw(x);
            error = x.cause().message;
          } catch (const std::exception& x) {
            error = x.what();
          }
        }
      }
      if (mask == 0) {
        if (state != "done")
          tell(fmt::format("{}: no fault reaches it, but it is {}{}", task, state,
                            error ? ": " + *error : std::string{}));
        continue;
      }
      std::string from;
      for (std::size_t j = 0; j < dag.faults.size(); ++j)
        if (mask >> j & 1)
          from += fmt::format("{}{}.{}", from.empty() ? "" : ", ", dag.name, dag.faults[j]);
      if (!error) {
        tell(fmt::format("{}: fault {} reaches it, but it is {}", task, from, state));
        continue;
      }
      bool named = false;
      for (std::size_t j = 0; j < dag.faults.size(); ++j)
        if ((mask >> j & 1)
            && error->find(fmt::format("fault {}.{}", dag.name, dag.faults[j]))
                 != std::string::npos)
          named = true;
      if (!named)
        tell(fmt::format("{}: failed from '{}', not from fault {} that reach it", task, *error,
                         from));
      ++poisoned;
    }
    result_.expectations.push_back(expectation_result{
      dag.where,
      fmt::format("(random-dag {}): exactly the tasks its faults reach failed, from them",
                  dag.name),
      bad.empty(),
      bad.empty() ? fmt::format("{} fault(s) failed {} of {} tasks, the others done",
                                dag.faults.size(), poisoned, dag.events.size())
                  : bad});
  }

  /// `(data)`: the value read back from each task no fault reaches is the
  /// one the loader computed.
  void check_dag_data(const dag_decl& dag) {
    std::string bad;
    std::size_t checked = 0;
    for (std::size_t i = 0; i < dag.hosts.size() && bad.empty(); ++i) {
      int h = dag.hosts[i];
      if (h < 0)
        continue;
      auto task = fmt::format("{}.{}", dag.name, i);
      if (!host_done_[h] || b_.state(*host_done_[h]) != event_state::done) {
        bad = fmt::format("{}: its value was not read back ({})", task,
                          host_done_[h] ? to_string(b_.state(*host_done_[h])) : "never ran");
        continue;
      }
      const auto& got = hosts_[h];
      auto want = dag.expected[i];
      for (std::size_t k = 0; k < got.size(); ++k)
        if (!close(got[k], want, 1e-5)) {
          bad = fmt::format("{} holds {} (element {}), expected {}", task, got[k], k, want);
          break;
        }
      ++checked;
    }
    result_.expectations.push_back(expectation_result{
      dag.where, fmt::format("(random-dag {}): every task's data as computed", dag.name),
      bad.empty(),
      bad.empty() ? fmt::format("{} tasks' values as computed on the host", checked) : bad});
  }

  void build_outputs() {
    auto rec = std::make_shared<run_record>();
    rec->start_ns = start_;
    rec->traces = std::move(traces_);
    rec->host_slices = std::move(host_slices_);
    rec->model = std::move(model_);
    rec->edges = std::move(edges_);
    rec->texts.assign(std::make_move_iterator(texts_.begin()),
                      std::make_move_iterator(texts_.end()));
    text_ids_.clear();
    for (const auto& e : p_.events)
      rec->event_names.push_back(e.name);
    for (const auto& f : p_.families)
      rec->families.push_back(event_family{f.first, f.per_iter, f.times, f.decl, f.step,
                                           f.parts, {}});
    for (int d = 0; d < p_.devices; ++d)
      rec->device_names.push_back(dev(d).name());
    for (auto& dev_items : rec->model)
      for (auto& it : dev_items)
        it.source = nullptr; // the program may go before the result
    result_.record_bytes = bytes_of(*rec);
    if (opts_.timeline) {
      result_.tl = make_timeline(*rec, p_.devices);
      result_.logical = make_logical(*rec, result_);
    }
    result_.record = std::move(rec);
  }

  // -- progress ----------------------------------------------------------------

  void start_progress() {
    if (!opts_.on_progress)
      return;
    progress_ = std::thread{[this] {
      auto first = clock::now() + std::chrono::duration<double>(opts_.progress_after_s);
      std::unique_lock lock{progress_mu_};
      if (progress_cv_.wait_until(lock, first, [&] { return progress_stop_; }))
        return;
      for (;;) {
        lock.unlock();
        std::vector<device_progress> ps;
        for (int d = 0; d < p_.devices; ++d)
          ps.push_back(progress_of(d));
        opts_.on_progress(ps);
        lock.lock();
        if (progress_cv_.wait_for(lock, std::chrono::duration<double>(opts_.progress_interval_s),
                                  [&] { return progress_stop_; }))
          return;
      }
    }};
  }

  /// What is known of device `d`'s progress; for a device that cannot be
  /// asked any more (its node is gone), what was known last.
  device_progress progress_of(int d) const {
    try {
      auto p = ask_progress(d);
      last_progress_[d] = p;
      return p;
    } catch (const std::exception&) {
      return last_progress_[d];
    }
  }

  device_progress ask_progress(int d) const {
    auto last = b_.all_work(dev(d));
    const auto& r = dev(d).get_runner();
    auto resolved = [&](uint64_t s) { return b_.state(event{r, s}) != event_state::pending; };
    uint64_t lo = 0, hi = last.seq(); // resolved(lo) holds (seq 0 is done), find the last
    while (lo < hi) {
      auto mid = lo + (hi - lo + 1) / 2;
      if (resolved(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    return device_progress{lo, last.seq()};
  }

  void stop_progress() {
    {
      std::lock_guard guard{progress_mu_};
      progress_stop_ = true;
    }
    progress_cv_.notify_all();
    if (progress_.joinable())
      progress_.join();
  }

  const program& p_;
  const run_options& opts_;
  mutable std::map<int, device_progress> last_progress_; // the progress thread's
  run_result result_;
  std::map<std::string, std::unique_ptr<node_process>> spawned_;
  std::map<int, device_trace> last_traces_;
  std::map<int, std::size_t> judged_upto_; // see close_books
  std::unique_ptr<backend> bp_;
  backend& b_;
  std::vector<device> devices_;
  std::vector<std::optional<context>> contexts_;
  std::vector<std::optional<event>> events_;
  std::vector<std::pair<int, int>> event_items_;
  std::vector<std::vector<float>> hosts_;
  /// (dag, task) -> the error of a step of a task a DAG fault reaches.
  std::map<std::pair<int, int>, std::string> dag_refused_;
  std::vector<std::optional<event>> host_done_;
  std::deque<std::vector<float>> host_data_;
  std::vector<std::shared_ptr<hold_latch>> holds_;
  /// Each hold's item (device, index into model_), {-1, -1} until queued.
  std::vector<std::pair<int, int>> hold_items_;
  /// When the step that makes each `timed` event began (trace clock), -1
  /// if it did not run.
  std::vector<int64_t> scheduled_ns_;
  /// By event id: the slots `(sync-in ...)` tasks wait on (null: none).
  std::vector<std::shared_ptr<event_slot>> slots_;
  std::vector<std::vector<model_item>> model_;
  std::vector<model_edge> edges_;
  /// The items' descriptions, each once (model_item::description), and
  /// their indexes; a kernel step's, by step.
  std::deque<std::string> texts_; // a deque: the map's keys point into it
  std::unordered_map<std::string_view, uint32_t> text_ids_;
  std::unordered_map<const step*, uint32_t> kernel_texts_;
  std::map<std::pair<int, int>, std::pair<int, int>> writers_;
  /// By (device, tnode): the copies on other devices that read it there
  /// since its last writer (a later writer waits for them).
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> readers_;
  std::map<int, std::set<int64_t>> script_pools_;
  std::vector<std::pair<const step*, std::size_t>> deferred_;
  /// The block of named iterations running (`run_family`): its steps'
  /// copy, the iteration, and the program's step the one running stands for.
  std::vector<step> scratch_;
  /// Each `(round ...)` once recorded (by index into `program::rounds`),
  /// and whether a round's body is being recorded now: its steps then add
  /// nothing to the model and bind recorded events.
  std::vector<std::optional<recorded_round>> rounds_;
  bool recording_ = false;
  int64_t iteration_ = -1;
  /// For the runs of named blocks with such items (`item_text`): the order
  /// of the first item of each iteration.
  struct family_run {
    int family = -1;
    std::vector<uint64_t> starts;
  };
  std::vector<family_run> family_runs_;
  const step* source_ = nullptr;
  /// The origins of the failures expectations saw (and of those reported).
  std::set<origin> seen_;
  std::vector<device_trace> traces_;
  std::vector<slice> host_slices_;
  int64_t start_ = 0;
  uint64_t next_order_ = 0;
  bool stopped_ = false;
  std::thread progress_;
  std::mutex progress_mu_;
  std::condition_variable progress_cv_;
  bool progress_stop_ = false;
};

} // namespace

run_result run(const program& p, const run_options& opts) {
  runner_state rs{p, opts};
  return rs.go();
}

} // namespace multidev::scenario
