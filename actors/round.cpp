// Recorded rounds (issue 41): the capture behind `backend::record` and the
// per-call replay behind `backend::replay` (docs/design.md, "Recorded rounds").
#include "actors/round_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "actors/backend_impl.hpp"
#include "actors/binding.hpp"
#include "actors/device_actor.hpp"
#include "actors/remote/endpoint_remote.hpp"
#include "actors/remote/message_checks.hpp"
#include "actors/remote/node_rounds.hpp"
#include "multidev/backend.hpp"
#include "multidev/kernels.hpp"

namespace multidev {

using detail::record_of;

namespace detail {

constinit thread_local capture* current_capture = nullptr;

/// What `replay_events` is made of, set by a replay on the devices: the
/// round and its lanes' last seqs.
struct replay_access {
  static void set(replay_events& out, const std::shared_ptr<round_state>& st,
                  std::span<const uint64_t> ends) {
    out.round_id_ = st->id;
    out.st_ = st;
    if (ends.size() <= out.few_ends_.size())
      std::copy(ends.begin(), ends.end(), out.few_ends_.begin());
    else
      out.ends_.assign(ends.begin(), ends.end());
  }
  static void set_nodes(replay_events& out, const std::shared_ptr<round_state>& st,
                        std::shared_ptr<const node_replay> nodes) {
    out.round_id_ = st->id;
    out.st_ = st;
    out.nodes_ = std::move(nodes);
  }
};

uint64_t next_backend_id() noexcept {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

uint32_t next_round_id() noexcept {
  static std::atomic<uint32_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

node_ref recorded_node() {
  static const node_ref n{"multidev-recorded-round"};
  return n;
}

event round_state::recorded_event(std::size_t i) const {
  return event{device_key{recorded_node(), id}, static_cast<uint64_t>(i) + 1};
}

std::size_t round_state::index_of(const event& e, const char* what) const {
  if (!is_recorded(e) || e.key().device_id != id || e.seq() == 0 || e.seq() > items.size())
    throw std::invalid_argument(fmt::format(
      "{}: {} is not an event recorded in round '{}' (an event returned inside its "
      "record body)",
      what, to_sexp(e).to_string(), name));
  return static_cast<std::size_t>(e.seq() - 1);
}

std::optional<std::size_t> round_state::last_on(const device& d) const {
  for (auto i = items.size(); i-- > 0;)
    if (items[i].dev == d)
      return i;
  return std::nullopt;
}

event round_state::add(round_item it, std::string_view label) {
  it.name = fmt::format("{} {}", label, items.size());
  if (std::find(devices.begin(), devices.end(), it.dev) == devices.end())
    devices.push_back(it.dev);
  items.push_back(std::move(it));
  return recorded_event(items.size() - 1);
}

round_state& capture_of(const backend_impl& owner, const char* call) {
  auto* c = current_capture;
  if (c->owner != &owner)
    throw std::invalid_argument(fmt::format(
      "{}: this thread is recording round '{}' of another backend; a round records "
      "the calls of the backend that records it only",
      call, c->round->name));
  return *c->round;
}

void refuse_in_round(const char* call, const char* why) {
  auto* c = current_capture;
  throw std::invalid_argument(fmt::format("{}: cannot be recorded in round '{}': {}", call,
                                          c ? c->round->name : std::string{"?"}, why));
}

namespace {

/// "replay N of round 'R', item 'I'".
std::string provenance(const round_state& st, uint64_t n, std::size_t i) {
  return fmt::format("replay {} of round '{}', item '{}'", n, st.name, st.items[i].name);
}

/// A replayed item's work: its failure says which replay, round and item
/// it was. Built only when the work throws.
struct with_provenance {
  std::function<void()> inner;
  const round_state* st; // kept by the backend (keep_for_replays)
  std::size_t item;
  uint64_t n;
  void operator()() const {
    try {
      inner();
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("{}: {}", provenance(*st, n, item), e.what()));
    } catch (...) {
      throw std::runtime_error(fmt::format("{}: unknown exception", provenance(*st, n, item)));
    }
  }
};

/// A replayed task's or routine's work: the recorded closure (or the
/// routine's task) itself, run in place (the round is kept while its
/// replays run, see keep_for_replays), with the failure text of
/// `with_provenance`. 16 trivially copyable bytes, so the task's
/// `std::function` holds it without allocating.
struct replayed_task {
  const round_state* st;
  uint32_t item;
  uint32_t n; // the replay's number, modulo 2^32
  void operator()() const {
    const auto& it = st->items[item];
    try {
      (it.k == round_item::kind::run ? it.r.schedule : it.work).work();
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("{}: {}", provenance(*st, n, item), e.what()));
    } catch (...) {
      throw std::runtime_error(fmt::format("{}: unknown exception", provenance(*st, n, item)));
    }
  }
};

/// `t`: item `i` of `st` (a closure or a routine) as replay `n`'s step.
void replayed(const round_state& st, uint32_t i, uint64_t n, bulk_task& t) {
  const auto& it = st.items[i];
  const auto& recorded = it.k == round_item::kind::run ? it.r.schedule : it.work;
  t.work = replayed_task{&st, i, static_cast<uint32_t>(n)};
  t.description = recorded.description; // the round keeps the recorded keep_alive
  t.kind = recorded.kind;
}

/// `f()`, its `std::invalid_argument` prefixed with item `i`'s provenance
/// in replay `n` of `st` ("replay: replay 3 of round 'R', item 'I': ...").
template <class F>
decltype(auto) as_item(const round_state& st, uint64_t n, std::size_t i, F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("replay: {}: {}", provenance(st, n, i), e.what()));
  }
}

/// `t`: a memset of `[offset, offset + size)` of pool `pool_id` as replay
/// `n`'s step for item `i` of `st` on `core`: the order `memset_zero`
/// pushes, its pool looked up now (and held until it runs). Throws
/// `std::invalid_argument` with the item's provenance when the span is not
/// in a pool there.
void memset_step(device_core& core, const round_state& st, std::size_t i, uint64_t n,
                 int pool_id, std::size_t offset, std::size_t size, bulk_task& t,
                 std::vector<work_order>& orders) {
  auto pool = as_item(st, n, i, [&] {
    return core.pools().span(pool_id, offset, size, "memset_zero");
  });
  auto& o = orders.emplace_back(); // reserved for every step: no reallocation
  o.dst = pool->base() + offset;
  o.bytes = size;
  o.what = "memset_zero";
  o.id = pool_id;
  o.naming = work_order::pool_span;
  o.offset = offset;
  t.order = &o;
  t.kind = trace_kind::memset;
  t.keep_alive = std::move(pool);
}

/// `t`: step `k` of `st`, one end of a copy (`round_step::send` or
/// `write`) on `core`, as replay `n`'s step: a send reads the span `at`
/// names into `bytes`, a write writes `bytes` into it, each through the
/// device's driver in its order, the span's pool looked up now and held
/// until it runs. Throws `std::invalid_argument` with the item's
/// provenance when the span is not in a pool there.
void copy_end_step(device_core& core, const round_state& st, std::size_t k, uint64_t n,
                   bool send, const buffer_arg& at, const std::shared_ptr<round_bytes>& bytes,
                   bulk_task& t) {
  if (!bytes)
    throw std::logic_error("push_part: a copy's step without its bytes");
  auto pool = as_item(st, n, k, [&] {
    return core.pools().span(at.loc.pool_id, at.loc.offset, at.size_in_bytes,
                             send ? "device_to_device (source)"
                                  : "device_to_device (destination)");
  });
  auto* drv = &core.drv();
  std::byte* p = pool->base() + at.loc.offset;
  auto size = at.size_in_bytes;
  if (send) {
    t.work = with_provenance{[drv, p, size, bytes] {
                               bytes->data.resize(size);
                               drv->copy(reinterpret_cast<std::byte*>(bytes->data.data()), p,
                                         size);
                             },
                             &st, k, n};
  } else {
    // The gate before it opened once the bytes were whole (`done` checks
    // each part): fewer here is a logic error, failed rather than copied.
    t.work = with_provenance{[drv, p, size, bytes] {
                               if (bytes->data.size() != size)
                                 throw std::runtime_error(fmt::format(
                                   "device_to_device: {} of the copy's {} bytes came",
                                   bytes->data.size(), size));
                               drv->copy(p, reinterpret_cast<const std::byte*>(bytes->data.data()),
                                         size);
                             },
                             &st, k, n};
  }
  t.description = st.items[k].name;
  t.kind = trace_kind::copy;
  t.keep_alive = std::move(pool);
}

/// A pool call of a replay pushed at once, undone when the replay is
/// refused: pool `id` of `core` was `old` before it, and the call left
/// `installed` there (null for a `free_pool`).
struct pool_undo {
  device_core* core;
  int id;
  std::shared_ptr<pool> old;
  std::shared_ptr<pool> installed;
};

/// `t`: item `i` of `st`, an `alloc_pool` or a `free_pool` on `core`, as
/// replay `n`'s step: the table changed now, as the call changes it, and an
/// order of trace kind `pool` that releases the pool it replaced or freed
/// once the work before it is done, as the call's (for an `alloc_pool` that
/// replaced none, an order that releases nothing: a step per item keeps a
/// lane's steps as many at each replay). The change is logged in `undo`
/// first. Throws `std::invalid_argument` with the item's provenance (no
/// pool to free, a request the device refuses), `device_error`.
/// (`alloc`: an `alloc_pool` of `pool_id` with `size`, `alignment`,
/// `mode`; else a `free_pool`. `quota`: a node session's, which an
/// `alloc_pool` checks as the `alloc` message does.)
void pool_step(device_core& core, const round_state& st, std::size_t i, uint64_t n, bool alloc,
               int pool_id, std::size_t size, std::size_t alignment,
               std::optional<memory_mode> mode, bulk_task& t, std::vector<work_order>& orders,
               std::vector<pool_undo>& undo, const peer_guard* quota = nullptr) {
  auto& u = undo.emplace_back(pool_undo{&core, pool_id, nullptr, nullptr});
  try {
    u.old = as_item(st, n, i, [&] {
      if (!alloc)
        return core.memory().take_pool(pool_id);
      if (quota)
        quota->check_alloc_quota(pool_id, size);
      return core.memory().replace_pool(pool_id, size, alignment, mode, &u.installed);
    });
  } catch (...) {
    undo.pop_back(); // nothing changed
    throw;
  }
  auto& o = orders.emplace_back(); // reserved for every step: no reallocation
  o.what = !alloc ? "free_pool" : u.old ? "release replaced pool" : "alloc_pool";
  o.id = pool_id;
  o.naming = work_order::pool;
  t.order = &o;
  t.kind = trace_kind::pool;
  t.keep_alive = u.old;
}

/// What a replay pushed at once makes, per thread, reused: the steps'
/// work, the named tasks' bindings (their descriptions), the lanes' last
/// seqs, the seqs whose wrappers read the round. Cleared of the work as
/// each replay ends (`replay_scratch::use`).
struct replay_scratch {
  bulk_push push;
  std::vector<bulk_task> tasks;
  std::vector<task> bound;
  std::vector<work_order> orders; // the memsets' and pool calls' (`bulk_task::order`)
  std::vector<pool_undo> undo;    // the pool calls' changes, until pushed
  std::vector<uint64_t> ends;
  std::vector<std::pair<const device_core*, uint64_t>> kept;

  /// This thread's, sized for `steps` steps and `lanes` lanes; the work is
  /// dropped when the returned guard goes.
  struct guard {
    replay_scratch& s;
    ~guard() {
      s.tasks.clear();
      s.bound.clear();
      // A replay refused after its pool calls changed the tables: they
      // are as before it, newest first (the pools they made go now), but
      // for an id another thread's pool call changed since, which keeps
      // that call's change (as if it came after the replay's).
      for (auto u = s.undo.rbegin(); u != s.undo.rend(); ++u) {
        try {
          u->core->memory().put_back(u->id, std::move(u->old), u->installed);
        } catch (...) {
          // Out of memory: that pool stays out of the table.
        }
      }
      s.undo.clear();
    }
  };
  static guard use(std::size_t steps, std::size_t lanes) {
    thread_local replay_scratch s;
    s.tasks.resize(steps);
    s.ends.resize(lanes);
    s.bound.reserve(steps);
    s.orders.clear();
    s.orders.reserve(steps);
    return guard{s};
  }

  /// `t`: named task `spec` bound on `core` now (its pools looked up, its
  /// arguments as they are), wrapped with item `item`'s provenance in
  /// replay `n` of `st`. Throws `std::invalid_argument` with that
  /// provenance when it does not bind.
  void bind(const std::shared_ptr<device_core>& core, const task_spec& spec,
            const round_state& st, std::size_t item, uint64_t n, bulk_task& t) {
    auto b = as_item(st, n, item, [&] { return bind_spec(core, spec); });
    auto& kept_task = bound.emplace_back(std::move(b.work));
    t.work = with_provenance{std::move(kept_task.work), &st, item, n};
    t.description = kept_task.description;
    t.kind = kept_task.kind;
    t.keep_alive = std::move(kept_task.keep_alive);
  }

  /// Each lane's last seq (`last`) as the seqs the backend keeps `st` for.
  void keep(backend_impl& impl, const std::shared_ptr<round_state>& st,
            std::span<device_core* const> lanes, std::span<const uint64_t> last) {
    kept.clear();
    for (std::size_t l = 0; l < lanes.size(); ++l)
      kept.emplace_back(lanes[l], last[l]);
    keep_for_replays(impl, st, kept);
  }
};

/// Checks that `d` is a device of `impl` (made or attached there).
void check_device(const backend_impl& impl, const device& d) {
  impl.endpoint_of(d);
}

} // namespace

void keep_for_replays(backend_impl& impl, const std::shared_ptr<round_state>& st,
                      std::span<const std::pair<const device_core*, uint64_t>> pushed) {
  // The rounds let go of here go after the lock: a round's plan may take
  // other locks as it goes (a node part's drop).
  std::vector<std::shared_ptr<const round_state>> gone;
  std::lock_guard guard{impl.rounds_mu};
  for (const auto& [c, seq] : pushed) {
    auto at = std::find_if(st->last_local.begin(), st->last_local.end(),
                           [c](const auto& x) { return x.first == c; });
    if (at == st->last_local.end())
      st->last_local.emplace_back(c, seq);
    else
      at->second = std::max(at->second, seq);
  }
  auto& kept = impl.replayed_rounds;
  std::erase_if(kept, [&st, &gone](std::shared_ptr<const round_state>& x) {
    if (x == st || x.use_count() > 1)
      return false;
    if (!std::all_of(x->last_local.begin(), x->last_local.end(), [](const auto& cs) {
          return cs.first->outcomes().finished() >= cs.second;
        }))
      return false;
    gone.push_back(std::move(x));
    return true;
  });
  if (std::find(kept.begin(), kept.end(), st) == kept.end())
    kept.push_back(st);
}

/// The items of a replay call by call whose work reads the round (tasks,
/// local named tasks, routines), with their seqs.
void keep_for_replays(backend_impl& impl, const std::shared_ptr<round_state>& st,
                      std::span<const event> pushed) {
  std::vector<std::pair<const device_core*, uint64_t>> wrapped; // merged per device there
  for (std::size_t i = 0; i < pushed.size(); ++i) {
    auto k = st->items[i].k;
    const auto* c = pushed[i].core().get();
    if (c && (k == round_item::kind::task || k == round_item::kind::named
              || k == round_item::kind::run))
      wrapped.emplace_back(c, pushed[i].seq());
  }
  keep_for_replays(impl, st, wrapped);
}

// -- Capture --------------------------------------------------------------------

void record_task(const backend_impl& impl, const device& d, task&& t) {
  auto& st = capture_of(impl, "schedule_task");
  auto& rec = record_of(d);
  check_device(impl, d);
  if (!rec.r.local_core())
    refuse_remote(rec, "schedule_task",
                  "a closure cannot travel there: schedule a kernel registered on its "
                  "node with schedule_named");
  round_item it;
  it.k = round_item::kind::task;
  it.dev = d;
  std::string label = t.description.empty() ? std::string{"task"} : t.description;
  it.work = std::move(t);
  st.add(std::move(it), label);
}

event record_named(const backend_impl& impl, const device& d, const task_spec& spec) {
  auto& st = capture_of(impl, "schedule_named");
  check_device(impl, d);
  check_task_spec(spec); // the kernel and its arguments' kinds; pools at replay
  round_item it;
  it.k = round_item::kind::named;
  it.dev = d;
  it.spec = spec;
  it.slots.assign(spec.args.size(), false);
  return st.add(std::move(it), spec.kernel);
}

std::vector<event> record_batch(const backend_impl& impl, const device& d,
                                std::span<const task_spec> specs) {
  capture_of(impl, "schedule_batch");
  check_device(impl, d);
  for (const auto& s : specs) // none recorded when one does not fit
    check_task_spec(s);
  std::vector<event> out;
  out.reserve(specs.size());
  for (const auto& s : specs)
    out.push_back(record_named(impl, d, s));
  return out;
}

void record_wait(const backend_impl& impl, const context& ctx, const event& e) {
  auto& st = capture_of(impl, "will_wait_for");
  check_device(impl, ctx.device);
  round_item it;
  it.k = round_item::kind::wait;
  it.dev = ctx.device;
  it.ctx = ctx;
  if (is_recorded(e)) {
    it.on_item = st.index_of(e, "will_wait_for");
  } else if (e.key() != device_key{}) {
    auto ep = e.endpoint();
    if (!ep)
      throw std::invalid_argument(fmt::format(
        "will_wait_for: no device of this process has the key of {} (attach its device "
        "first)",
        to_sexp(e).to_string()));
    auto state = e.core() ? e.core()->outcomes().state(e.seq()) : ep->state(e.seq());
    if (state == event_state::pending)
      throw std::invalid_argument(fmt::format(
        "will_wait_for: cannot be recorded in round '{}': {} was made outside the round "
        "and is still pending, so a replay could not tell whether to wait for it again; "
        "wait on an event returned inside the record body, or sync it before recording",
        st.name, to_sexp(e).to_string()));
    it.on = e; // resolved: each replay waits on it as the call would (a no-op when done)
  }
  st.add(std::move(it), "wait");
}

event record_run(const backend_impl& impl, const routine& r) {
  auto& st = capture_of(impl, "run");
  if (!r.schedule.work)
    throw std::invalid_argument(fmt::format(
      "run: routine '{}' has no task to run again (a copy across processes happens in "
      "device_to_device itself: call it again)",
      r.name));
  auto& rec = record_of(r.context.device);
  check_device(impl, r.context.device);
  local_core(rec, "run",
             "schedule its kernels with schedule_named (buffer arguments are locations in "
             "its pools: alloc_node gives them)");
  round_item it;
  it.k = round_item::kind::run;
  it.dev = r.context.device;
  it.r = r;
  return st.add(std::move(it), fmt::format("run {}", r.name));
}

std::optional<routine> record_copy(const backend_impl& impl, const tnode& t,
                                   merge_buffer_use into, const context& dst,
                                   const context& src) {
  auto& st = capture_of(impl, "device_to_device");
  check_device(impl, dst.device);
  check_device(impl, src.device);
  if (!src.buffers.contains(t))
    return std::nullopt;
  if (into == merge_buffer_use::no && !dst.buffers.contains(t))
    return std::nullopt;
  round_item it;
  it.k = round_item::kind::copy;
  it.dev = dst.device;
  it.ctx = dst;
  it.src = src;
  it.node = t;
  it.into = into;
  routine r;
  r.name = fmt::format("device_to_device #{} {} -> {} (recorded in round '{}')", t.id,
                       src.device.name(), dst.device.name(), st.name);
  r.copy_source = std::make_shared<const context>(src);
  r.inputs.insert(t);
  if (into == merge_buffer_use::no) {
    r.context = dst;
    r.outputs.insert(t);
  } else {
    r.context = dst;
    r.context.parent = std::make_shared<const context>(dst);
    r.context.merge_buffer_node = t;
  }
  // No task to run again: `run` refuses it (a replay of the round copies).
  r.schedule = task{r.name, nullptr, {}, trace_kind::copy};
  st.add(std::move(it), "copy");
  return r;
}

void record_pool_call(const backend_impl& impl, round_item::kind k, const device& d, int pool_id,
                      std::size_t offset, std::size_t size, std::size_t alignment,
                      std::optional<memory_mode> mode) {
  const char* call = k == round_item::kind::memset       ? "memset_zero"
                     : k == round_item::kind::alloc_pool ? "alloc_pool"
                                                         : "free_pool";
  auto& st = capture_of(impl, call);
  check_device(impl, d);
  round_item it;
  it.k = k;
  it.dev = d;
  it.pool_id = pool_id;
  it.offset = offset;
  it.size = size;
  it.alignment = alignment;
  it.mode = mode;
  st.add(std::move(it), fmt::format("{} {}", call, pool_id));
}

event recorded_all_work(const backend_impl& impl, const device& d) {
  auto& st = capture_of(impl, "all_work");
  check_device(impl, d);
  auto last = st.last_on(d);
  if (!last)
    throw std::invalid_argument(fmt::format(
      "all_work: cannot be recorded in round '{}': nothing was recorded on {} yet, so "
      "its all_work would name work outside the round; call it after recording work "
      "there, or before record",
      st.name, d.name()));
  return st.recorded_event(*last);
}

void push_part(backend_impl& impl, const std::shared_ptr<round_state>& st,
               std::span<device_core* const> lanes,
               std::span<const std::shared_ptr<device_core>> cores,
               std::span<const bulk_step> steps, std::span<const round_step* const> specs,
               uint64_t n, std::span<const std::shared_ptr<gate>> external,
               std::span<uint64_t> ends, const std::shared_ptr<round_state>& source,
               std::span<const int32_t> closures,
               std::span<const std::shared_ptr<round_bytes>> bytes) {
  auto g = replay_scratch::use(steps.size(), lanes.size());
  auto& s = g.s;
  std::vector<const routine*> routines;
  std::vector<std::size_t> routine_steps;
  for (std::size_t k = 0; k < steps.size(); ++k) {
    if (steps[k].wait_on != -1)
      continue;
    if (const auto* rs = specs[k]) {
      if (rs->op == round_step::zero) {
        const auto& span = std::get<buffer_arg>(rs->spec.args.at(0));
        memset_step(*cores[steps[k].lane], *st, k, n, span.loc.pool_id, span.loc.offset,
                    span.size_in_bytes, s.tasks[k], s.orders);
      } else if (rs->op == round_step::alloc || rs->op == round_step::free) {
        const auto& pool = std::get<buffer_arg>(rs->spec.args.at(0));
        std::optional<memory_mode> mode;
        if (rs->mode >= 0)
          mode = static_cast<memory_mode>(rs->mode); // checked by check_round_part
        pool_step(*cores[steps[k].lane], *st, k, n, rs->op == round_step::alloc,
                  pool.loc.pool_id, pool.size_in_bytes, rs->alignment, mode, s.tasks[k],
                  s.orders, s.undo, impl.guard.get());
      } else if (rs->op == round_step::send || rs->op == round_step::write) {
        copy_end_step(*cores[steps[k].lane], *st, k, n, rs->op == round_step::send,
                      std::get<buffer_arg>(rs->spec.args.at(0)),
                      k < bytes.size() ? bytes[k] : nullptr, s.tasks[k]);
      } else {
        s.bind(cores[steps[k].lane], rs->spec, *st, k, n, s.tasks[k]);
      }
      continue;
    }
    // A closure or routine of this process's part: as replay_on_devices
    // runs one.
    if (!source || k >= closures.size() || closures[k] < 0)
      throw std::logic_error("push_part: a task step with neither a spec nor a closure");
    auto i = static_cast<uint32_t>(closures[k]);
    const auto& it = source->items[i];
    replayed(*source, i, n, s.tasks[k]);
    if (it.k == round_item::kind::run) {
      as_item(*source, n, i, [&] { routine_push::check_pins(it.r); });
      routines.push_back(&it.r);
      routine_steps.push_back(k);
    }
  }
  if (routines.empty()) {
    s.push.push(lanes, steps, s.tasks, ends, external, false);
    s.undo.clear(); // pushed: the pool calls' changes stay
  } else {
    // The caller waited for room (it holds the lock the notices take).
    routine_push held{routines, lanes, false};
    s.push.push(lanes, steps, s.tasks, ends, external, false);
    std::vector<uint64_t> lane_steps(lanes.size()), ordinal(steps.size());
    for (std::size_t k = 0; k < steps.size(); ++k)
      ordinal[k] = ++lane_steps[steps[k].lane];
    for (std::size_t j = 0; j < routines.size(); ++j) {
      auto k = routine_steps[j];
      auto l = steps[k].lane;
      held.wrote(j, ends[l] - lane_steps[l] + ordinal[k]);
    }
  }
  s.keep(impl, st, lanes, ends);
  if (source)
    s.keep(impl, source, lanes, ends);
}

} // namespace detail

// -- round ----------------------------------------------------------------------

detail::round_state& round::st() const {
  if (!state_)
    throw std::invalid_argument("round: an empty round (default-constructed)");
  return *state_;
}

const std::string& round::name() const { return st().name; }
std::size_t round::size() const { return st().items.size(); }
uint64_t round::replays() const { return st().replays.load(std::memory_order_relaxed); }

const std::string& round::item_name(std::size_t i) const {
  auto& s = st();
  if (i >= s.items.size())
    throw std::invalid_argument(fmt::format("round '{}': no item {} (it has {})", s.name, i,
                                            s.items.size()));
  return s.items[i].name;
}

std::size_t round::index_of(const event& recorded) const {
  return st().index_of(recorded, "round::index_of");
}

void round::name_item(const event& recorded, std::string name) {
  auto& s = st();
  s.items[s.index_of(recorded, "round::name_item")].name = std::move(name);
  std::lock_guard guard{s.images_mu};
  s.images.clear(); // they copied the names
}

round_slot round::slot(const event& recorded, std::size_t arg) {
  auto& s = st();
  auto i = s.index_of(recorded, "round::slot");
  auto& it = s.items[i];
  if (it.k != detail::round_item::kind::named)
    throw std::invalid_argument(fmt::format(
      "round::slot: item '{}' of round '{}' is not a named task (only a named task's "
      "scalar arguments can be slots)",
      it.name, s.name));
  if (arg >= it.spec.args.size())
    throw std::invalid_argument(fmt::format(
      "round::slot: item '{}' of round '{}' (kernel '{}') has {} arguments, not {}",
      it.name, s.name, it.spec.kernel, it.spec.args.size(), arg + 1));
  if (std::holds_alternative<buffer_arg>(it.spec.args[arg]))
    throw std::invalid_argument(fmt::format(
      "round::slot: argument {} of item '{}' of round '{}' (kernel '{}') is a buffer; only "
      "scalar arguments can be slots",
      arg, it.name, s.name, it.spec.kernel));
  it.slots[arg] = true;
  std::lock_guard guard{s.images_mu};
  s.images.clear(); // their node parts list the slots they had
  return round_slot{i, arg};
}

namespace {

/// Node `x`'s lanes' last seqs of replay `nr` of `st`, once its answer is
/// in; its refusal as a `device_error`.
const std::vector<uint64_t>& node_ends(const detail::round_state& st,
                                       const detail::node_replay& nr, uint32_t x) {
  const auto& r = *nr.replies[x];
  r.wait();
  if (r.flag.load(std::memory_order_acquire) == 2) {
    const auto& nd = st.nodes.nodes[x];
    throw device_error(nd.name, fmt::format("replay {} of round '{}' on node {}: {}", nr.n,
                                            st.name, nd.name, describe_error(r.err)));
  }
  return r.ends;
}

kernel_arg& slot_arg(detail::round_state& s, round_slot sl) {
  if (sl.item >= s.items.size() || s.items[sl.item].k != detail::round_item::kind::named
      || sl.arg >= s.items[sl.item].slots.size() || !s.items[sl.item].slots[sl.arg])
    throw std::invalid_argument(fmt::format(
      "round::arg: (item {}, argument {}) is not a slot of round '{}' (mark it with "
      "round::slot)",
      sl.item, sl.arg, s.name));
  return s.items[sl.item].spec.args[sl.arg];
}

} // namespace

round::arg_ref round::arg(round_slot s) {
  slot_arg(st(), s);
  return arg_ref{st(), s};
}

const kernel_arg& round::arg(round_slot s) const {
  return slot_arg(st(), s);
}

round::arg_ref& round::arg_ref::set(kernel_arg v) {
  auto& a = slot_arg(*st_, s_);
  const auto& it = st_->items[s_.item];
  auto def = find_kernel(it.spec.kernel);
  if (!def)
    throw std::invalid_argument(fmt::format("round::arg: kernel '{}' is no longer registered",
                                            it.spec.kernel));
  check_kernel_arg(it.spec.kernel, s_.arg, def->params.at(s_.arg), v);
  a = std::move(v);
  return *this;
}

round::arg_ref& round::arg_ref::operator=(double v) { return set(kernel_arg{v}); }
round::arg_ref& round::arg_ref::operator=(int64_t v) { return set(kernel_arg{v}); }
round::arg_ref& round::arg_ref::operator=(std::string v) { return set(kernel_arg{std::move(v)}); }
const kernel_arg& round::arg_ref::value() const { return slot_arg(*st_, s_); }

sexp round::describe() const {
  auto& s = st();
  auto items = sexp::list({sexp::atom("items")});
  for (std::size_t i = 0; i < s.items.size(); ++i)
    items.push_back(sexp::list({sexp::atom("item"), sexp::field("index", std::to_string(i)),
                                sexp::field("name", s.items[i].name),
                                sexp::field("device", s.items[i].dev.name())}));
  return sexp::list({sexp::atom("round"), sexp::field("name", s.name),
                     sexp::field("replays", std::to_string(replays())), std::move(items)});
}

std::size_t replay_events::size() const noexcept {
  return st_ ? st_->items.size() : items_.size();
}

event replay_events::item(std::size_t i) const {
  if (i >= size())
    throw std::invalid_argument(
      fmt::format("replay_events::item: no item {} (the round has {})", i, size()));
  if (!st_)
    return items_[i];
  if (nodes_) {
    const auto& np = st_->nodes;
    const auto& ie = np.item_events[i];
    const auto& nd = np.nodes[ie.node];
    auto base = node_ends(*st_, *nodes_, ie.node)[ie.lane] - nd.lane_steps[ie.lane];
    return event{nd.eps[ie.lane],
                 ie.step >= 0 ? base + nd.step_ordinal[static_cast<std::size_t>(ie.step)] : base};
  }
  const auto& p = st_->plan;
  const auto& ie = p.item_events[i];
  auto base = end_of(ie.lane) - p.lane_steps[ie.lane];
  return event{p.eps[ie.lane],
               ie.step >= 0 ? base + p.step_ordinal[static_cast<std::size_t>(ie.step)] : base};
}

std::vector<event> replay_events::items() const {
  if (!st_)
    return items_;
  std::vector<event> out;
  out.reserve(size());
  for (std::size_t i = 0; i < size(); ++i)
    out.push_back(item(i));
  return out;
}

event replay_events::of(const event& recorded) const {
  if (!detail::is_recorded(recorded) || recorded.key().device_id != round_id_
      || recorded.seq() == 0 || recorded.seq() > size())
    throw std::invalid_argument(fmt::format(
      "replay_events::of: {} is not an event recorded in this replay's round",
      to_sexp(recorded).to_string()));
  return item(static_cast<std::size_t>(recorded.seq() - 1));
}

std::vector<std::pair<device, event>> replay_events::all_work() const {
  if (!st_)
    return all_work_;
  std::vector<std::pair<device, event>> out;
  if (nodes_) {
    const auto& np = st_->nodes;
    for (std::size_t d = 0; d < st_->devices.size(); ++d) {
      auto [x, l] = np.device_lane[d];
      out.emplace_back(st_->devices[d], event{np.nodes[x].eps[l], node_ends(*st_, *nodes_, x)[l]});
    }
    return out;
  }
  const auto& p = st_->plan;
  for (std::size_t d = 0; d < st_->devices.size(); ++d)
    out.emplace_back(st_->devices[d],
                     event{p.eps[p.device_lane[d]], end_of(p.device_lane[d])});
  return out;
}

event replay_events::all_work_of(const device& d) const {
  if (st_ && nodes_) {
    const auto& np = st_->nodes;
    for (std::size_t i = 0; i < st_->devices.size(); ++i)
      if (st_->devices[i] == d) {
        auto [x, l] = np.device_lane[i];
        return event{np.nodes[x].eps[l], node_ends(*st_, *nodes_, x)[l]};
      }
  } else if (st_) {
    const auto& p = st_->plan;
    for (std::size_t i = 0; i < st_->devices.size(); ++i)
      if (st_->devices[i] == d)
        return event{p.eps[p.device_lane[i]], end_of(p.device_lane[i])};
  } else {
    for (const auto& [dev, e] : all_work_)
      if (dev == d)
        return e;
  }
  throw std::invalid_argument(
    fmt::format("replay_events::all_work_of: the round does not touch {}", d.name()));
}

// -- backend::record and backend::replay -------------------------------------------

round backend::record(const std::function<void()>& body) {
  static std::atomic<uint32_t> unnamed{1};
  return record(fmt::format("round {}", unnamed.fetch_add(1, std::memory_order_relaxed)),
                body);
}

round backend::record(std::string name, const std::function<void()>& body) {
  if (auto* c = detail::current_capture)
    throw std::invalid_argument(fmt::format(
      "record: this thread is already recording round '{}'; rounds do not nest (record "
      "'{}' before or after it)",
      c->round->name, name));
  if (!body)
    throw std::invalid_argument(fmt::format("record: round '{}' has no body", name));
  auto st = std::make_shared<detail::round_state>();
  st->id = detail::next_round_id();
  st->backend_id = impl_->id;
  st->name = std::move(name);
  detail::capture cap{impl_.get(), st.get()};
  struct reset {
    ~reset() { detail::current_capture = nullptr; }
  } guard;
  detail::current_capture = &cap;
  body();
  return round{std::move(st)};
}

namespace {

/// `d`'s image under `m` (itself when `m` is null or does not map it).
const device& image(const device_remap* m, const device& d) {
  if (m)
    for (const auto& [from, to] : *m)
      if (from == d)
        return to;
  return d;
}

/// `c`, or a copy of it in `tmp` on its device's image when `m` moves it:
/// only a remapped replay copies (or makes) a context.
const context& image(const device_remap* m, const context& c, std::optional<context>& tmp) {
  const auto& to = image(m, c.device);
  if (to == c.device)
    return c;
  tmp = c;
  tmp->device = to;
  return *tmp;
}

/// The devices `st` names: its items' own (`devices`), then each copy's
/// source not among them (a source may hold no item of its own).
std::vector<device> named_devices(const detail::round_state& st) {
  std::vector<device> named = st.devices;
  for (const auto& it : st.items)
    if (it.k == detail::round_item::kind::copy
        && std::find(named.begin(), named.end(), it.src.device) == named.end())
      named.push_back(it.src.device);
  return named;
}

/// `st0` as `m` moves it (`round_state::images`): made at the remap's first
/// replay, then found, its slot arguments set to the round's now; `st0`
/// itself when `m` moves none of the devices it names. Null when the round
/// holds a closure or a routine (those replays go call by call). An image
/// comes with `lock` holding its `image_replay_mu`, for the replay: two
/// threads replaying it would otherwise write its slots while the other
/// binds them.
std::shared_ptr<detail::round_state> image_of(const std::shared_ptr<detail::round_state>& st0,
                                              const device_remap& m,
                                              std::unique_lock<std::mutex>& lock) {
  using kind = detail::round_item::kind;
  auto& st = *st0;
  // The key: the pairs that move a device the round names.
  device_remap key;
  for (const auto& d : named_devices(st))
    if (const auto& to = image(&m, d); !(to == d))
      key.emplace_back(d, to);
  if (key.empty())
    return st0;
  for (const auto& it : st.items)
    if (it.k == kind::task || it.k == kind::run)
      return nullptr;
  std::shared_ptr<detail::round_state> img;
  {
    std::lock_guard cache{st.images_mu};
    for (auto at = st.images.begin(); at != st.images.end(); ++at)
      if (at->first == key) {
        img = at->second;
        // The most recently used last: the first one is let go first.
        std::rotate(at, at + 1, st.images.end());
        break;
      }
    if (!img) {
      img = std::make_shared<detail::round_state>();
      img->id = detail::next_round_id();
      img->backend_id = st.backend_id;
      img->name = st.name;
      img->items = st.items;
      std::optional<context> tmp;
      for (auto& it : img->items) {
        it.dev = image(&m, it.dev);
        it.ctx = image(&m, it.ctx, tmp);
        it.src = image(&m, it.src, tmp);
      }
      for (const auto& d : st.devices)
        img->devices.push_back(image(&m, d));
      if (st.images.size() >= detail::round_state::max_images)
        st.images.erase(st.images.begin());
      st.images.emplace_back(std::move(key), img);
    }
  }
  // The round's slot values of now (`round::arg` writes the round's items),
  // under the image's own lock, held for its replay.
  lock = std::unique_lock{img->image_replay_mu};
  for (std::size_t i = 0; i < st.items.size(); ++i)
    for (std::size_t a = 0; a < st.items[i].slots.size(); ++a)
      if (st.items[i].slots[a])
        img->items[i].spec.args[a] = st.items[i].spec.args[a];
  return img;
}

/// Why `d`'s node is gone, if it is (a device of this process never is):
/// its link closed, or the session of the node `impl` attached it from
/// ended. The keeper marks the session ended before it tells the links, so
/// a failure a host thread saw from the loss is seen here too.
std::optional<std::string> lost(const detail::backend_impl& impl, const device& d) {
  auto& rec = record_of(d);
  if (rec.r.local_core())
    return std::nullopt;
  if (auto why = rec.ep().unreachable())
    return why;
  std::lock_guard guard{impl.mu};
  for (const auto& n : impl.nodes)
    if (n.ended->load() && std::find(n.devices.begin(), n.devices.end(), d) != n.devices.end())
      return fmt::format("the session of node {} ({}) ended: it was lost or detached", n.name,
                         n.address);
  return std::nullopt;
}

/// The pool ids device `d` has now (its `debug_info`: one round trip for a
/// device of another process).
std::set<int> pools_of(detail::backend_impl& impl, const device& d) {
  std::set<int> ids;
  auto info = impl.endpoint_of(d).debug_info();
  if (const auto* pools = info.find("pools"))
    for (const auto& p : pools->items())
      if (p.is_list())
        if (const auto* id = p.find("id"); id && id->items().size() == 2)
          ids.insert(std::stoi(id->items()[1].as_atom()));
  return ids;
}

/// Builds `st.plan` (replay_plan): usable when every item is a task, a
/// named task, a routine (neither a copy nor reading the merge buffer), a
/// copy between two devices, a memset or a wait, on devices of this
/// process, or a task, a named task, a memset, a pool call or a wait there
/// (pool calls change the tables as the steps are made, so not beside
/// routines and copies, which look their pools up first), and
/// every wait is on an item of the round (or on an event already done when
/// recorded). The edges the calls' bookkeeping makes between a round's own
/// routines and copies (`unmet_waits`) become wait steps of the plan: a
/// copy reading a node waits for the round's last writer of it on the
/// source's lane (read after write, data), and a writer of a node waits
/// for the round's copies reading it since its last writer on other lanes
/// (write after read, ordering only). (A node's writers all run on its own
/// device's lane: a routine there, or a copy into it.)
void build_plan(const detail::round_state& st, detail::replay_plan& p) {
  using kind = detail::round_item::kind;
  auto lane_of = [&p](const device& d) -> std::optional<uint32_t> {
    auto* c = record_of(d).r.local_core();
    if (!c)
      return std::nullopt;
    for (uint32_t l = 0; l < p.lanes.size(); ++l)
      if (p.lanes[l] == c)
        return l;
    p.cores.push_back(record_of(d).r.core());
    p.lanes.push_back(c);
    p.eps.push_back(record_of(d).r.endpoint());
    p.lane_steps.push_back(0);
    return static_cast<uint32_t>(p.lanes.size() - 1);
  };
  // An item the plan does not take: the round goes call by call.
  auto refuse = [&p] { p = detail::replay_plan{}; };
  // Per node of a device (the key), the round's last writer step of it so
  // far (-1: none) and the steps reading it since, with their lanes.
  struct hazards {
    int32_t writer = -1;
    uint32_t writer_lane = 0;
    std::vector<std::pair<int32_t, uint32_t>> readers;
  };
  std::map<std::pair<const detail::device_record*, tnode>, hazards> nodes;
  // The waits the next item's step needs: on which step, ordering only
  // or not (one per step, a data one when it is both).
  std::vector<std::pair<int32_t, bool>> needs;
  auto need = [&needs](int32_t step, bool order_only) {
    for (auto& [k, order] : needs)
      if (k == step) {
        order = order && order_only;
        return;
      }
    needs.emplace_back(step, order_only);
  };
  auto reads = [&](const detail::device_record* rec, const tnode& t, uint32_t lane) {
    if (auto x = nodes.find({rec, t}); x != nodes.end() && x->second.writer >= 0
                                       && x->second.writer_lane != lane)
      need(x->second.writer, false);
  };
  auto writes = [&](const detail::device_record* rec, const tnode& t, uint32_t lane) {
    if (auto x = nodes.find({rec, t}); x != nodes.end())
      for (auto [k, l] : x->second.readers)
        if (l != lane)
          need(k, true);
  };
  auto read = [&](const detail::device_record* rec, const tnode& t, uint32_t lane, int32_t k) {
    nodes[{rec, t}].readers.emplace_back(k, lane);
  };
  auto wrote = [&](const detail::device_record* rec, const tnode& t, uint32_t lane, int32_t k) {
    auto& x = nodes[{rec, t}];
    x.writer = k;
    x.writer_lane = lane;
    x.readers.clear();
  };
  // The lane's last step so far (-1: none yet in the replay).
  std::vector<int32_t> last_step;
  auto add_step = [&](uint32_t lane, int32_t wait_on, std::size_t i, bool order_only = false) {
    p.steps.push_back(detail::bulk_step{lane, order_only, wait_on});
    p.step_item.push_back(static_cast<uint32_t>(i));
    p.step_ordinal.push_back(++p.lane_steps[lane]);
    last_step[lane] = static_cast<int32_t>(p.steps.size() - 1);
    return last_step[lane];
  };
  // The waits `needs` lists, as steps on `lane` before item `i`'s.
  auto add_needs = [&](uint32_t lane, std::size_t i) {
    std::sort(needs.begin(), needs.end());
    for (auto [k, order_only] : needs)
      add_step(lane, k, i, order_only);
    needs.clear();
  };
  for (std::size_t i = 0; i < st.items.size(); ++i) {
    const auto& it = st.items[i];
    auto lane = lane_of(it.dev);
    if (!lane)
      return refuse(); // a device of another process
    last_step.resize(p.lanes.size(), -1);
    switch (it.k) {
    case kind::task:
    case kind::named:
      p.item_events.push_back({*lane, add_step(*lane, -1, i)});
      break;
    case kind::run: {
      if (!detail::routine_push::takes(it.r))
        return refuse(); // a copy, or a read of the merge buffer
      // Its inputs are read on its own device (its lane): only its outputs
      // can wait, for the round's copies reading them elsewhere.
      auto* rec = &record_of(it.dev);
      for (const auto& t : it.r.outputs)
        writes(rec, t, *lane);
      add_needs(*lane, i);
      auto k = add_step(*lane, -1, i);
      p.item_events.push_back({*lane, k});
      p.routine_steps.push_back(static_cast<uint32_t>(k));
      p.routines.push_back(&it.r);
      p.written_in_round.push_back(0);
      for (const auto& t : it.r.inputs)
        read(rec, t, *lane, k);
      for (const auto& t : it.r.outputs)
        wrote(rec, t, *lane, k);
      break;
    }
    case kind::copy: {
      // On the destination's lane (`it.dev`), from a device of this process.
      if (!record_of(it.src.device).r.local_core())
        return refuse();
      auto* src = &record_of(it.src.device);
      auto* dst = &record_of(it.dev);
      reads(src, it.node, *lane);
      if (it.into == merge_buffer_use::no)
        writes(dst, it.node, *lane);
      add_needs(*lane, i);
      auto k = add_step(*lane, -1, i);
      p.item_events.push_back({*lane, k});
      p.routine_steps.push_back(static_cast<uint32_t>(k));
      p.routines.push_back(nullptr);
      auto x = nodes.find({src, it.node});
      p.written_in_round.push_back(x != nodes.end() && x->second.writer >= 0);
      p.copies = true;
      read(src, it.node, *lane, k);
      if (it.into == merge_buffer_use::no)
        wrote(dst, it.node, *lane, k);
      break;
    }
    case kind::wait: {
      std::optional<detail::replay_plan::item_event> on;
      if (it.on_item) {
        on = p.item_events.at(*it.on_item);
      } else if (it.on.key() != device_key{}) {
        auto& c = it.on.core();
        if (!c || !c->outcomes().is_done(it.on.seq()))
          return refuse(); // an outside event not done when recorded
      }
      if (!on || on->lane == *lane) {
        // Nothing to wait for at a replay: done, or earlier in this
        // device's own order.
        p.item_events.push_back({*lane, last_step[*lane]});
        break;
      }
      if (on->step < 0)
        return refuse(); // on work from before the round
      p.item_events.push_back({*lane, add_step(*lane, on->step, i)});
      break;
    }
    case kind::memset:
      // An order entry (`push_order`'s), its pool looked up at each replay.
      p.item_events.push_back({*lane, add_step(*lane, -1, i)});
      break;
    case kind::alloc_pool:
    case kind::free_pool:
      // The table changed as the step is made (`pool_step`), and an order
      // entry for the release.
      p.item_events.push_back({*lane, add_step(*lane, -1, i)});
      p.pools = true;
      break;
    }
  }
  // Routines and copies look their pools up, and pin them, before the
  // steps are made (in round order, which pool calls would have to
  // follow): such a round with pool calls goes call by call.
  if (p.pools && !p.routines.empty())
    return refuse();
  for (const auto& d : st.devices)
    p.device_lane.push_back(*lane_of(d));
  p.usable = true;
}

/// A replay on the devices (`replay_plan`): each item's entry made (a
/// task's closure, a named task bound to its pools as they are now), then
/// all pushed at once. Scratch per thread, reused: allocates nothing but a
/// named task's binding and the events handed back.
void replay_on_devices(backend& b, const std::shared_ptr<detail::round_state>& st, uint64_t n,
                       replay_events& out) {
  using kind = detail::round_item::kind;
  auto& impl = b.impl();
  const auto& p = st->plan;
  // Pool calls change the tables as their steps are made: room first, so
  // that the changes are seen by other threads only while the steps are
  // made and pushed, not while waiting for room.
  if (p.pools)
    for (auto* c : p.lanes)
      c->wait_for_room();
  auto g = detail::replay_scratch::use(p.steps.size(), p.lanes.size());
  auto& s = g.s;
  // The copies' routines, built now (their pools looked up as a call does).
  std::vector<routine> copies;
  std::vector<const routine*> routines;
  if (p.copies) {
    copies.reserve(p.routines.size());
    routines = p.routines;
    for (std::size_t j = 0; j < routines.size(); ++j) {
      if (routines[j])
        continue;
      auto i = p.step_item[p.routine_steps[j]];
      const auto& it = st->items[i];
      auto& c = copies.emplace_back(detail::as_item(*st, n, i, [&] {
        auto r = detail::local_copy(b, it.node, it.into, it.ctx, it.src, false);
        if (!r)
          throw std::invalid_argument(fmt::format(
            "device_to_device: node {} is not in the context of {} or of {}", it.node.label,
            it.src.device.name(), it.ctx.device.name()));
        return std::move(*r);
      }));
      routines[j] = &c;
      auto& t = s.tasks[p.routine_steps[j]];
      t.work = detail::with_provenance{std::move(c.schedule.work), st.get(), i, n};
      t.description = c.schedule.description;
      t.kind = c.schedule.kind;
      t.keep_alive = c.schedule.keep_alive;
    }
  }
  for (std::size_t k = 0; k < p.steps.size(); ++k) {
    if (p.steps[k].wait_on >= 0)
      continue;
    auto i = p.step_item[k];
    const auto& it = st->items[i];
    if (it.k == kind::task || it.k == kind::run)
      detail::replayed(*st, i, n, s.tasks[k]);
    else if (it.k == kind::named)
      s.bind(p.cores[p.steps[k].lane], it.spec, *st, i, n, s.tasks[k]);
    else if (it.k == kind::memset)
      detail::memset_step(*p.cores[p.steps[k].lane], *st, i, n, it.pool_id, it.offset, it.size,
                          s.tasks[k], s.orders);
    else if (it.k == kind::alloc_pool || it.k == kind::free_pool)
      detail::pool_step(*p.cores[p.steps[k].lane], *st, i, n, it.k == kind::alloc_pool,
                        it.pool_id, it.size, it.alignment, it.mode, s.tasks[k], s.orders,
                        s.undo);
    // (a copy: made above)
  }
  if (p.routines.empty()) {
    s.push.push(p.lanes, p.steps, s.tasks, s.ends, {}, !p.pools);
    s.undo.clear(); // pushed: the pool calls' changes stay
  } else {
    // Routines and copies: the transfers' bookkeeping around one push
    // (routine_push).
    const auto& all = p.copies ? routines : p.routines;
    for (std::size_t j = 0; j < all.size(); ++j)
      detail::as_item(*st, n, p.step_item[p.routine_steps[j]],
                      [&] { detail::routine_push::check_pins(*all[j]); });
    detail::routine_push held{all, p.lanes, true, p.written_in_round};
    s.push.push(p.lanes, p.steps, s.tasks, s.ends, {}, false);
    for (std::size_t j = 0; j < p.routine_steps.size(); ++j) {
      auto k = p.routine_steps[j];
      auto l = p.steps[k].lane;
      held.wrote(j, s.ends[l] - p.lane_steps[l] + p.step_ordinal[k]);
    }
  }
  detail::replay_access::set(out, st, s.ends);
  // The lanes' last seqs bound the wrapped items' (a wait's entry reads
  // nothing of the round, so erring late only keeps it longer).
  s.keep(impl, st, p.lanes, s.ends);
}

/// Whether every copy into a merge buffer of the devices' plan fits the
/// buffer as it is: one that would grow it goes call by call (the growth
/// replaces pool 0 ordered with the work, between the copies of the replay).
/// Whether the merge buffers the node plan's copies write are large enough
/// (as the calls made them).
bool merge_buffers_fit(const detail::node_plan& np) {
  for (const auto& [d, size] : np.merges) {
    auto& rec = record_of(d);
    std::lock_guard guard{rec.mu};
    if (rec.merge_buffer_capacity < size)
      return false;
  }
  return true;
}

bool merge_buffers_fit(const detail::round_state& st) {
  if (!st.plan.copies)
    return true;
  for (auto k : st.plan.routine_steps) {
    const auto& it = st.items[st.plan.step_item[k]];
    if (it.k == detail::round_item::kind::copy && it.into == merge_buffer_use::copy
        && !detail::merge_buffer_fits(it.ctx, it.node))
      return false;
  }
  return true;
}

/// Builds `np` (node_plan): usable when every item is a named task, a
/// memset, a pool call, a copy or a wait (and, on this process's devices, a task or
/// a routine, not beside pool calls there), on a device of a node attached
/// with a session or of this process
/// (at least one on a node), and every wait is on an item of the round (or
/// on an event of this process done when recorded). This process takes
/// part as a node does (`host_rounds`). A wait between two participants'
/// devices becomes a step of the waiting one that the awaited one's
/// `round_done` opens.
void build_node_plan(backend& b, const detail::round_state& st, detail::node_plan& np) {
  auto& impl = b.impl();
  using kind = detail::round_item::kind;
  using node = detail::node_plan::node;
  auto refuse = [&np] {
    np.usable = false;
    np.nodes.clear();
    np.item_events.clear();
    np.device_lane.clear();
  };
  // Per node, per lane: its last step so far (-1: none).
  std::vector<std::vector<int32_t>> last_step;
  struct where {
    uint32_t node, lane;
  };
  auto locate = [&](const device& d) -> std::optional<where> {
    auto& rec = record_of(d);
    const bool here = rec.r.local_core() != nullptr;
    caf::actor actor;
    uint64_t session = 0;
    std::string name;
    std::size_t ordinal = 0;
    device first;
    if (here) {
      if (!np.host)
        np.host = detail::host_rounds_of(b);
      actor = caf::actor_cast<caf::actor>(np.host->actor);
      name = detail::this_process(); // as the nodes name this process's devices
    } else {
      std::lock_guard guard{impl.mu};
      for (const auto& n : impl.nodes) {
        auto at = std::find(n.devices.begin(), n.devices.end(), d);
        if (at == n.devices.end() || n.ended->load())
          continue;
        actor = n.node;
        session = n.session;
        name = n.name;
        ordinal = static_cast<std::size_t>(at - n.devices.begin());
        first = n.devices.front();
        break;
      }
    }
    if (!actor || (session == 0 && !here))
      return std::nullopt; // a device attached alone, or a node without sessions
    uint32_t x = 0;
    while (x < np.nodes.size() && np.nodes[x].actor != actor.address())
      ++x;
    if (x == np.nodes.size()) {
      node fresh;
      fresh.here = here;
      fresh.actor = actor.address();
      fresh.session = session;
      fresh.name = name;
      if (!here)
        fresh.sender = record_of(first).r.endpoint();
      fresh.part.round = st.id;
      fresh.round = st.id;
      fresh.part.name = st.name;
      np.nodes.push_back(std::move(fresh));
      last_step.emplace_back();
    }
    auto& nd = np.nodes[x];
    uint32_t l = 0;
    while (l < nd.lanes.size() && nd.lanes[l] != d)
      ++l;
    if (l == nd.lanes.size()) {
      nd.lanes.push_back(d);
      nd.eps.push_back(rec.r.endpoint());
      // This process's lanes are given as devices (`session_rounds::put`).
      nd.part.devices.push_back(static_cast<uint32_t>(here ? l : ordinal));
      nd.lane_steps.push_back(0);
      last_step[x].push_back(-1);
    }
    return where{x, l};
  };
  auto add_step = [&](where w, round_step step) {
    auto& nd = np.nodes[w.node];
    step.lane = w.lane;
    nd.part.steps.push_back(std::move(step));
    nd.step_ordinal.push_back(++nd.lane_steps[w.lane]);
    auto k = static_cast<int32_t>(nd.part.steps.size() - 1);
    last_step[w.node][w.lane] = k;
    return k;
  };
  // Node `x`'s index for node `y` among its peers (added when new).
  auto peer_of = [&np](uint32_t x, uint32_t y) {
    auto& peers = np.nodes[x].part.peers;
    const auto& other = np.nodes[y];
    for (uint32_t p = 0; p < peers.size(); ++p)
      if (peers[p].node.address() == other.actor)
        return p;
    // This process: no address, the nodes reach it over their sessions.
    auto [host, port] = other.here ? std::pair<std::string, uint16_t>{}
                                   : detail::node_address(*other.sender);
    peers.push_back(round_peer{caf::actor_cast<caf::actor>(other.actor), other.session,
                               other.name, host, port});
    return static_cast<uint32_t>(peers.size() - 1);
  };
  bool routines_here = false, pools_here = false;
  // A round all here that the devices' plan refused is not one for this
  // plan either (nor worth this process's round actor).
  if (std::all_of(st.items.begin(), st.items.end(),
                  [](const detail::round_item& it) { return record_of(it.dev).r.local_core(); }))
    return refuse();
  for (std::size_t i = 0; i < st.items.size(); ++i) {
    const auto& it = st.items[i];
    auto w = locate(it.dev);
    if (!w)
      return refuse();
    auto item = static_cast<uint32_t>(i);
    switch (it.k) {
    case kind::run:
      if (!detail::routine_push::takes(it.r))
        return refuse(); // a copy, or a read of the merge buffer
      routines_here = true;
      [[fallthrough]]; // a routine runs on a device of this process: as a closure
    case kind::task: {
      auto& at = np.nodes[w->node];
      if (!at.here)
        return refuse(); // a closure cannot travel to a node
      auto k = add_step(*w, round_step{item, 0, -1, 0, 0, it.name, {}, {}});
      at.closures.resize(static_cast<std::size_t>(k), -1);
      at.closures.push_back(static_cast<int32_t>(i));
      np.item_events.push_back({w->node, w->lane, k});
      break;
    }
    case kind::named: {
      auto k = add_step(*w, round_step{item, 0, -1, 0, 0, it.name, {}, it.spec});
      auto& nd = np.nodes[w->node];
      for (std::size_t a = 0; a < it.slots.size(); ++a)
        if (it.slots[a]) {
          nd.part.slot_steps.push_back(static_cast<uint32_t>(k));
          nd.part.slot_args.push_back(static_cast<uint32_t>(a));
          nd.slots.push_back(round_slot{i, a});
        }
      np.item_events.push_back({w->node, w->lane, k});
      break;
    }
    case kind::wait: {
      if (!it.on_item) {
        if (it.on.key() != device_key{}) {
          auto& c = it.on.core();
          if (!c || !c->outcomes().is_done(it.on.seq()))
            return refuse(); // an outside event not known done when recorded
        }
        np.item_events.push_back({w->node, w->lane, last_step[w->node][w->lane]});
        break;
      }
      auto on = np.item_events.at(*it.on_item);
      if (on.node == w->node && on.lane == w->lane) {
        np.item_events.push_back({w->node, w->lane, last_step[w->node][w->lane]});
        break;
      }
      if (on.step < 0)
        return refuse(); // on work from before the round
      round_step step{item, 0, on.step, 0, 0, it.name, {}, {}};
      if (on.node != w->node) {
        // Node to node: the awaited node tells this one (round_done).
        auto& awaited = np.nodes[on.node];
        step.wait_on = detail::bulk_step::external;
        step.peer = peer_of(w->node, on.node);
        step.peer_item = awaited.part.steps[static_cast<std::size_t>(on.step)].item;
        step.peer_device = awaited.lanes[on.lane].name();
        auto back = peer_of(on.node, w->node);
        auto& ns = awaited.part.notify_steps;
        auto& npr = awaited.part.notify_peers;
        bool told = false;
        for (std::size_t k = 0; k < ns.size(); ++k)
          told = told || (ns[k] == static_cast<uint32_t>(on.step) && npr[k] == back);
        if (!told) {
          ns.push_back(static_cast<uint32_t>(on.step));
          npr.push_back(back);
        }
      }
      np.item_events.push_back({w->node, w->lane, add_step(*w, std::move(step))});
      break;
    }
    case kind::memset: {
      round_step step{item, 0, -1, 0, 0, it.name, {}, {}};
      step.spec.args.emplace_back(buffer_arg{buffer_loc{it.pool_id, it.offset}, it.size});
      step.op = round_step::zero;
      np.item_events.push_back({w->node, w->lane, add_step(*w, std::move(step))});
      break;
    }
    case kind::alloc_pool:
    case kind::free_pool: {
      // Its table change made as the part's steps are, on the node (or
      // here), as `replay_on_devices` makes it (`pool_step`).
      pools_here = pools_here || np.nodes[w->node].here;
      round_step step{item, 0, -1, 0, 0, it.name, {}, {}};
      auto size = it.k == kind::alloc_pool ? it.size : 0;
      step.spec.args.emplace_back(buffer_arg{buffer_loc{it.pool_id, 0}, size});
      step.op = it.k == kind::alloc_pool ? round_step::alloc : round_step::free;
      step.alignment = it.alignment;
      step.mode = it.mode ? static_cast<int32_t>(*it.mode) : -1;
      np.item_events.push_back({w->node, w->lane, add_step(*w, std::move(step))});
      break;
    }
    case kind::copy: {
      // A send on the source's lane (a read in its order, as the call's)
      // and, on the destination's, a wait for the bytes (on the send, the
      // same node or process; or on the item from the source's node, whose
      // notice carries them) and their write (in its order, the item's
      // event) into the destination's buffer, or into its merge buffer
      // (pool 0 at 0; a replay goes call by call while that is too small,
      // `merges`: the call grows it). Into a device of this process, each
      // replay makes the write the node's writer there (`copies_here`), as
      // the call does.
      auto ws = locate(it.src.device);
      if (!ws || it.src.device == it.dev)
        return refuse();
      const auto size = it.node.size_in_bytes;
      auto from = it.src.buffers.find(it.node);
      if (from == it.src.buffers.end())
        return refuse(); // not recorded so (record_copy): the calls say why
      buffer_loc to{0, 0};
      if (it.into == merge_buffer_use::no) {
        auto at = it.ctx.buffers.find(it.node);
        if (at == it.ctx.buffers.end())
          return refuse();
        to = at->second;
      } else {
        np.merges.emplace_back(it.dev, size);
      }
      round_step send{item, 0, -1, 0, 0, it.name, {}, {}};
      send.spec.args.emplace_back(buffer_arg{from->second, size});
      send.op = round_step::send;
      auto sent = add_step(*ws, std::move(send));
      round_step wait{item, 0, sent, 0, 0, it.name, {}, {}};
      if (ws->node != w->node) {
        wait.wait_on = detail::bulk_step::external;
        wait.peer = peer_of(w->node, ws->node);
        wait.peer_item = item;
        wait.peer_device = np.nodes[ws->node].lanes[ws->lane].name();
        auto& source = np.nodes[ws->node].part;
        source.notify_steps.push_back(static_cast<uint32_t>(sent));
        source.notify_peers.push_back(peer_of(ws->node, w->node));
      }
      add_step(*w, std::move(wait));
      round_step write{item, 0, -1, 0, 0, it.name, {}, {}};
      write.spec.args.emplace_back(buffer_arg{to, size});
      write.op = round_step::write;
      np.item_events.push_back({w->node, w->lane, add_step(*w, std::move(write))});
      if (np.nodes[w->node].here)
        np.copies_here.push_back(item);
      break;
    }
    default:
      return refuse();
    }
  }
  // Routines pin their pools before this process's part is pushed: with
  // pool calls there, call by call (as build_plan).
  if (routines_here && pools_here)
    return refuse();
  for (auto& nd : np.nodes)
    if (nd.here)
      nd.closures.resize(nd.part.steps.size(), -1);
  for (const auto& d : st.devices) {
    auto w = locate(d);
    np.device_lane.emplace_back(w->node, w->lane);
  }
  np.usable = true;
}

/// Tells participant `to` of replay `nr` (it pushed the replay) that
/// participant `from` did not (it refused it, or its link closed before it
/// answered): `to`'s waits of that replay on `from`'s items fail
/// (`session_rounds::refused`; a node hears `round_refused`).
void tell_refusal(const detail::node_replay& nr, std::size_t from, std::size_t to) {
  const auto& rt = *nr.routes;
  const auto& f = rt.nodes[from];
  const auto& t = rt.nodes[to];
  auto refusing = caf::actor_cast<caf::actor>(f.actor);
  if (!refusing)
    return; // its actor is gone: its loss fails the waits on it
  std::string why;
  try {
    why = fmt::format("replay {} of round '{}' failed on node {}: {}", nr.n, rt.round_name,
                      f.name, describe_error(nr.replies[from]->err));
    if (why.size() > detail::wire_limits::text_bytes)
      why.resize(detail::wire_limits::text_bytes);
  } catch (...) {
    return; // out of memory: the node's loss, if it is one, still tells
  }
  if (t.here) {
    std::lock_guard guard{rt.host->mu};
    if (rt.host->rounds)
      rt.host->rounds->refused(t.round, nr.n, f.actor, why);
    return;
  }
  if (auto actor = caf::actor_cast<caf::actor>(t.actor))
    detail::request_node(*t.sender, actor,
                         caf::make_message(atoms::round_refused_atom::value, t.session, t.round,
                                           nr.n, refusing, why),
                         [](const caf::message&) {});
}

/// Participant `x`'s answer to replay `nr` is in (`flag` set; this
/// process's part's is in from the start). Each pair of a participant that
/// pushed the replay and one that did not is told once, when the later of
/// the two answers comes (`tell_refusal`), so a refusal reaches the others
/// as soon as each of them pushed, not after the slowest node. Only the
/// client hears every refusal (a node whose session ended holds no part to
/// name its peers), so it is the one that tells; without it, those waits
/// would hang. Any thread: CAF's I/O thread, a link's actor (a link that
/// closes fails its pending replies), the replaying thread.
void arrive(detail::node_replay& nr, std::size_t x) noexcept {
  // A node's actor that went down: the monitors of its peers (and of this
  // process's part) fail the waits on it, naming that.
  auto refused = [&nr](std::size_t k) {
    const auto& r = *nr.replies[k];
    return r.flag.load(std::memory_order_acquire) == 2
           && r.err != caf::sec::request_receiver_down;
  };
  auto pushed = [&nr](std::size_t k) {
    return nr.replies[k]->flag.load(std::memory_order_acquire) == 1;
  };
  // (Allocates only when a pair is to be told: a refusal.)
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  auto add = [&](std::size_t from, std::size_t to) {
    try {
      pairs.emplace_back(from, to);
    } catch (...) {
      // Out of memory: that pair goes untold (the node's loss, if it is
      // one, still fails the waits).
    }
  };
  {
    std::lock_guard guard{nr.arrive_mu};
    nr.replies[x]->in = true;
    if (!nr.routes)
      return;
    for (std::size_t k = 0; k < nr.replies.size(); ++k) {
      if (k == x || !nr.replies[k]->in)
        continue;
      if (refused(x) && pushed(k))
        add(x, k);
      else if (pushed(x) && refused(k))
        add(k, x);
    }
  }
  // Each pair on its own: one that cannot be told (out of memory) leaves
  // the others told.
  auto tell = [&nr](std::size_t from, std::size_t to) noexcept {
    try {
      tell_refusal(nr, from, to);
    } catch (...) {
    }
  };
  for (const auto& [from, to] : pairs)
    tell(from, to);
}

/// The reply to a round message from a node, into `r`: `ok(msg)` takes a
/// value (and says whether it was the one expected); an error or anything
/// else fails it. A replay's (`nr`, its participant `x`, else null) takes
/// the answer in then (`arrive`).
template <class Ok>
detail::reply_sink::handler fill(std::shared_ptr<detail::node_replay::reply> r, Ok ok,
                                 std::shared_ptr<detail::node_replay> nr = {},
                                 std::size_t x = 0) {
  return [r, ok, nr, x](const caf::message& m) {
    if (m.match_elements<caf::error>())
      r->err = m.get_as<caf::error>(0);
    else if (!ok(m, *r))
      r->err = make_error(errc::invalid_argument, {}, "the node's reply was not what was asked");
    r->flag.store(r->err ? 2 : 1, std::memory_order_release);
    r->flag.notify_all();
    if (nr)
      arrive(*nr, x);
  };
}

} // namespace

namespace detail {

/// Tells node `nd` to let go of its part (`round_drop`), not waiting.
void send_round_drop(const node_plan::node& nd) {
  if (auto actor = caf::actor_cast<caf::actor>(nd.actor))
    request_node(*nd.sender, actor,
                 caf::make_message(atoms::round_drop_atom::value, nd.session, nd.round),
                 [](const caf::message&) {});
}

node_plan::~node_plan() {
  if (!installed)
    return;
  for (auto& nd : nodes)
    try {
      if (nd.here) {
        // Through the host actor, which takes its lock: this may run under
        // it (a replay's `keep_for_replays` letting go of this round).
        host->drop(nd.round);
        continue;
      }
      send_round_drop(nd);
    } catch (...) {
      // Out of memory: the part stays until the session ends.
    }
}

} // namespace detail

namespace {

/// Sends each node its part, once (a round trip per node, at the first
/// replay on the nodes).
void install_parts(const std::shared_ptr<detail::round_state>& source) {
  auto& st = *source;
  auto& np = st.nodes;
  std::lock_guard guard{np.install_mu};
  if (np.installed)
    return;
  // This process's part first (kept by its host_rounds, its nodes
  // watched): refused, nothing was sent.
  for (auto& nd : np.nodes) {
    if (!nd.here)
      continue;
    std::lock_guard guard{np.host->mu};
    if (!np.host->rounds)
      throw device_error(nd.name, fmt::format("replay of round '{}': the backend shut down",
                                              st.name));
    np.host->rounds->put(nd.part, nd.lanes, source, nd.closures);
    np.host->watch(nd.part.peers);
  }
  std::vector<std::shared_ptr<detail::node_replay::reply>> replies;
  for (auto& nd : np.nodes) {
    auto r = std::make_shared<detail::node_replay::reply>();
    if (nd.here) {
      r->flag.store(1);
      replies.push_back(std::move(r));
      continue;
    }
    auto h = fill(r, [](const caf::message& m, auto&) { return m.match_elements<bool>(); });
    auto actor = caf::actor_cast<caf::actor>(nd.actor);
    if (!actor
        || !detail::request_node(*nd.sender, actor,
                                 caf::make_message(atoms::round_put_atom::value, nd.session,
                                                   nd.part),
                                 std::move(h))) {
      r->err = make_error(errc::device_failed, nd.name, "its link is closed");
      r->flag.store(2);
    }
    replies.push_back(std::move(r));
  }
  std::optional<std::size_t> refused;
  for (std::size_t x = 0; x < replies.size(); ++x) {
    replies[x]->wait();
    if (replies[x]->flag.load() == 2 && !refused)
      refused = x;
  }
  if (refused) {
    // The parts taken go again, so that a later replay installs them anew.
    for (std::size_t x = 0; x < replies.size(); ++x) {
      auto& nd = np.nodes[x];
      if (replies[x]->flag.load() != 1)
        continue;
      if (nd.here) {
        std::lock_guard guard{np.host->mu};
        if (np.host->rounds)
          np.host->rounds->drop(nd.round);
      } else {
        detail::send_round_drop(nd);
      }
    }
    const auto& nd = np.nodes[*refused];
    throw device_error(nd.name, fmt::format("replay of round '{}': node {} refused its part: {}",
                                            st.name, nd.name,
                                            describe_error(replies[*refused]->err)));
  }
  auto routes = std::make_shared<detail::node_plan::routes_t>();
  routes->round_name = st.name;
  routes->host = np.host;
  for (const auto& nd : np.nodes)
    routes->nodes.push_back({nd.here, nd.actor, nd.session, nd.round, nd.sender, nd.name});
  np.routes = std::move(routes);
  np.installed = true;
  // A node whose part waits on or tells another hears from us when we lose
  // that one: the route between them may run through this process. This
  // process's part too (its actor, `host_rounds`): it monitors the nodes'
  // actors (`host_rounds::watch`), but a session that ended leaves the
  // node's actor up.
  for (auto& nd : np.nodes)
    for (const auto& peer : nd.part.peers)
      for (auto& other : np.nodes) {
        if (other.actor != peer.node.address() || other.here)
          continue;
        if (!nd.here) {
          detail::watch_for_rounds(*other.sender, caf::actor_cast<caf::actor>(nd.actor),
                                   nd.session, peer.node);
          continue;
        }
        std::weak_ptr<detail::host_rounds> host = np.host;
        detail::watch_for_rounds_here(
          *other.sender, np.host.get(), peer.node,
          [host, lost = peer.node.address()](const std::string& why) {
            auto h = host.lock();
            if (!h)
              return;
            std::lock_guard guard{h->mu};
            if (h->rounds)
              h->rounds->peer_down(lost, fmt::format("this process lost it: {}", why));
          });
      }
  // The nodes hold the parts now: no handle of another system's actor is
  // kept here (a round may outlive its backend's actor system).
  for (auto& nd : np.nodes)
    nd.part = round_part{};
}

/// A replay on the nodes (`node_plan`): one `round_run` per node, not waited
/// for; the calls to the round's devices wait for it (`set_fence`), and the
/// replay's events for the node's reply.
void replay_on_nodes(const std::shared_ptr<detail::round_state>& st, uint64_t n,
                     replay_events& out) {
  auto& np = st->nodes;
  // The requests that add work sent to these devices without waiting (a
  // `depend`, a copy) first: the node, not their actors, pushes the replay.
  for (auto& nd : np.nodes)
    if (!nd.here)
      for (auto& ep : nd.eps)
        detail::settle_async(*ep);
  auto nr = std::make_shared<detail::node_replay>();
  nr->n = n;
  nr->routes = np.routes;
  auto slots_of = [&st](const detail::node_plan::node& nd) {
    std::vector<wire_arg> slots;
    slots.reserve(nd.slots.size());
    for (const auto& sl : nd.slots)
      slots.push_back(to_wire(st->items[sl.item].spec.args[sl.arg]));
    return slots;
  };
  // This process's part first, pushed whole here: refused, nothing was sent.
  std::vector<std::shared_ptr<detail::node_replay::reply>> here(np.nodes.size());
  for (std::size_t x = 0; x < np.nodes.size(); ++x) {
    const auto& nd = np.nodes[x];
    if (!nd.here)
      continue;
    std::vector<detail::device_core*> lanes;
    for (const auto& d : nd.lanes)
      lanes.push_back(record_of(d).r.local_core());
    // Room first, outside the lock that the nodes' notices take.
    for (auto* c : lanes)
      c->wait_for_room();
    auto r = std::make_shared<detail::node_replay::reply>();
    {
      std::lock_guard guard{np.host->mu};
      if (!np.host->rounds)
        throw device_error(nd.name, fmt::format("replay {} of round '{}': the backend shut down",
                                                n, st->name));
      r->ends = np.host->rounds->run(nd.round, n, slots_of(nd));
    }
    // Its copies' writes are the nodes' writers here now, as the calls'.
    for (auto i : np.copies_here) {
      const auto& it = st->items[i];
      const auto& at = np.item_events[i];
      if (at.node != x)
        continue;
      event done{nd.eps[at.lane],
                 r->ends[at.lane] - nd.lane_steps[at.lane]
                   + nd.step_ordinal[static_cast<std::size_t>(at.step)]};
      auto& rec = record_of(it.dev);
      std::lock_guard guard{rec.mu};
      if (it.into == merge_buffer_use::no)
        rec.updating_for[it.node] = done;
      else
        rec.updating_for_merge_buffer.emplace(it.node, done);
    }
    r->flag.store(1, std::memory_order_release);
    here[x] = std::move(r);
  }
  // Every answer's place first: a reply may come while the others are
  // sent, and `arrive` reads them all.
  // (Under the lock that `arrive` takes: the answers come on CAF's
  // threads, through uninstrumented CAF, which ThreadSanitizer cannot see.)
  {
    std::lock_guard guard{nr->arrive_mu};
    nr->replies.reserve(np.nodes.size());
    for (std::size_t x = 0; x < np.nodes.size(); ++x) {
      if (np.nodes[x].here) {
        here[x]->in = true;
        nr->replies.push_back(std::move(here[x]));
      } else {
        nr->replies.push_back(std::make_shared<detail::node_replay::reply>());
      }
    }
  }
  std::size_t x = 0;
  bool sent = false; // node x was sent the replay
  try {
    for (; x < np.nodes.size(); ++x, sent = false) {
      auto& nd = np.nodes[x];
      if (nd.here)
        continue;
      const auto& r = nr->replies[x];
      auto lanes = nd.lanes.size();
      auto h = fill(
        r,
        [lanes](const caf::message& m, detail::node_replay::reply& to) {
          if (!m.match_elements<std::vector<uint64_t>>()
              || m.get_as<std::vector<uint64_t>>(0).size() != lanes)
            return false;
          to.ends = m.get_as<std::vector<uint64_t>>(0);
          return true;
        },
        nr, x);
      auto actor = caf::actor_cast<caf::actor>(nd.actor);
      bool taken = actor
                   && detail::request_node(*nd.sender, actor,
                                           caf::make_message(atoms::round_run_atom::value,
                                                             nd.session, nd.round, n,
                                                             slots_of(nd)),
                                           std::move(h));
      sent = true; // its answer is taken in below or by its handler, not by the catch
      if (!taken) {
        r->err = make_error(errc::device_failed, nd.name, "its link is closed");
        r->flag.store(2, std::memory_order_release);
        arrive(*nr, x);
      }
      for (auto& ep : nd.eps)
        detail::set_fence(*ep, r);
    }
  } catch (...) {
    // Out of memory part way: the nodes not sent the replay did not push
    // it, so the others are told (`arrive`) rather than wait on them.
    for (x += sent ? 1 : 0; x < np.nodes.size(); ++x) {
      if (np.nodes[x].here)
        continue;
      auto& r = *nr->replies[x];
      try {
        r.err = make_error(errc::device_failed, np.nodes[x].name, "the replay was not sent");
      } catch (...) {
      }
      r.flag.store(2, std::memory_order_release);
      r.flag.notify_all();
      arrive(*nr, x);
    }
    throw;
  }
  detail::replay_access::set_nodes(out, st, std::move(nr));
}

/// The checks of `backend::replay(r, remap)`, before anything is scheduled
/// (docs/api.md, "Recorded rounds").
void check_remap(detail::backend_impl& impl, const detail::round_state& st,
                 const device_remap& m) {
  using kind = detail::round_item::kind;
  const auto named = named_devices(st);
  auto touches = [&named](const device& d) {
    return std::find(named.begin(), named.end(), d) != named.end();
  };
  for (std::size_t i = 0; i < m.size(); ++i) {
    const auto& [from, to] = m[i];
    if (!from || !to)
      throw std::invalid_argument(fmt::format(
        "replay: remap of round '{}': pair {} holds an empty device handle", st.name, i));
    for (std::size_t j = 0; j < i; ++j)
      if (m[j].first == from)
        throw std::invalid_argument(fmt::format(
          "replay: remap of round '{}': {} is mapped twice (to {} and to {})", st.name,
          from.name(), m[j].second.name(), to.name()));
    if (!touches(from) || from == to)
      continue;
    // Where the round's devices end up: no two on one device (their pools
    // and orders would mix).
    for (const auto& d : named)
      if (d != from && image(&m, d) == to)
        throw std::invalid_argument(fmt::format(
          "replay: remap of round '{}': {} and {} would both run on {}; map each device "
          "of the round to a device of its own",
          st.name, d.name(), from.name(), to.name()));
    if (auto why = lost(impl, to))
      throw std::invalid_argument(fmt::format(
        "replay: remap of round '{}': target {} of {} is lost: {}", st.name, to.name(),
        from.name(), *why));
    try {
      impl.endpoint_of(to);
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument(fmt::format(
        "replay: remap of round '{}': target {} of {} is not a device of this backend "
        "(make or attach it here first)",
        st.name, to.name(), from.name()));
    }
    if (to.dev().driver != from.dev().driver)
      throw std::invalid_argument(fmt::format(
        "replay: remap of round '{}': target {} of {} has driver '{}', not '{}'; a round "
        "moves to devices of the driver it was recorded on",
        st.name, to.name(), from.name(), to.dev().driver, from.dev().driver));
  }
  // The moved items: what each needs of its target, and the pools they use
  // there, in record order: each target's pool table, read once, plus the
  // round's own alloc_pool there, minus its free_pool.
  std::vector<std::pair<device, std::set<int>>> pools;
  auto pools_at = [&](const device& to) -> std::set<int>& {
    for (auto& [d, ids] : pools)
      if (d == to)
        return ids;
    return pools.emplace_back(to, pools_of(impl, to)).second;
  };
  auto use = [&](const device& d, int pool, std::size_t i) {
    const auto& to = image(&m, d);
    if (to == d || pool == 0 || pools_at(to).contains(pool))
      return;
    throw std::invalid_argument(fmt::format(
      "replay: remap of round '{}': item '{}' uses pool {} of {}, but its target {} has "
      "no pool {} and the round does not allocate it there before; alloc_pool it on {} "
      "first",
      st.name, st.items[i].name, pool, d.name(), to.name(), pool, to.name()));
  };
  auto pool_made = [&](const device& d, int pool, bool made) {
    const auto& to = image(&m, d);
    if (to == d)
      return;
    if (made)
      pools_at(to).insert(pool);
    else
      pools_at(to).erase(pool);
  };
  for (std::size_t i = 0; i < st.items.size(); ++i) {
    const auto& it = st.items[i];
    const auto& to = image(&m, it.dev);
    switch (it.k) {
    case kind::task:
      if (to != it.dev && !record_of(to).r.local_core())
        throw std::invalid_argument(fmt::format(
          "replay: remap of round '{}': item '{}' is a closure (schedule_task) recorded on "
          "{}, and a closure cannot travel to {}, a device of another process",
          st.name, it.name, it.dev.name(), to.name()));
      break;
    case kind::run:
      if (to != it.dev)
        throw std::invalid_argument(fmt::format(
          "replay: remap of round '{}': item '{}' is a routine linked on {} (its pools "
          "pinned there), which cannot move to {}; record schedule_named instead",
          st.name, it.name, it.dev.name(), to.name()));
      break;
    case kind::named:
      for (const auto& a : it.spec.args)
        if (const auto* b = std::get_if<buffer_arg>(&a))
          use(it.dev, b->loc.pool_id, i);
      break;
    case kind::copy: {
      if (it.into == merge_buffer_use::no)
        if (auto at = it.ctx.buffers.find(it.node); at != it.ctx.buffers.end())
          use(it.ctx.device, at->second.pool_id, i);
      if (auto at = it.src.buffers.find(it.node); at != it.src.buffers.end())
        use(it.src.device, at->second.pool_id, i);
      break;
    }
    case kind::memset:
    case kind::free_pool:
      use(it.dev, it.pool_id, i);
      if (it.k == kind::free_pool)
        pool_made(it.dev, it.pool_id, false);
      break;
    case kind::alloc_pool:
      pool_made(it.dev, it.pool_id, true);
      break;
    case kind::wait:
      break;
    }
  }
}

} // namespace

replay_events backend::replay(const round& r) {
  return replay_mapped(r, nullptr);
}

replay_events backend::replay(const round& r, const device_remap& remap) {
  return replay_mapped(r, &remap);
}

replay_events backend::replay_mapped(const round& r, const device_remap* m) {
  if (detail::current_capture)
    detail::refuse_in_round("replay", "a replay inside a record would nest rounds");
  if (!r)
    throw std::invalid_argument("replay: an empty round (default-constructed)");
  std::shared_ptr<detail::round_state> st = r.state();
  if (st->backend_id != impl_->id)
    throw std::invalid_argument(fmt::format(
      "replay: round '{}' was recorded by another backend; replay it there", st->name));
  // Under a remap, the round as moved (when it holds no closure or
  // routine): its plans replay it as the round's own replay it.
  std::shared_ptr<detail::round_state> moved;
  std::unique_lock<std::mutex> moved_lock; // held for the image's replay
  if (m) {
    check_remap(*impl_, *st, *m);
    moved = image_of(st, *m, moved_lock);
  }
  // A lost device (its node killed, its session ended) is refused before
  // anything is scheduled: a replay either starts whole or not at all.
  for (const auto& d0 : st->devices) {
    const auto& d = image(m, d0);
    if (auto why = lost(*impl_, d))
      throw device_error(
        record_of(d).ep().name(),
        fmt::format("replay {} of round '{}': its device {} is lost ({}); nothing of the "
                    "replay was scheduled. Replay the round with a remap of {} to a live "
                    "device of driver '{}' (backend::replay(r, remap))",
                    st->replays.load(std::memory_order_relaxed) + 1, st->name, d.name(), *why,
                    d.name(), d.dev().driver));
  }
  // The device-side replay, when the round runs in this process: every
  // entry pushed at once, or none (docs/design.md, "Recorded rounds").
  std::optional<uint64_t> retry; // the replay's number, when it goes call by call after all
  if ((!m || moved) && !st->by_calls) {
    // An image's replays are the round's: its number, and `replay_events::of`
    // takes the round's recorded events.
    const auto& run = moved ? moved : st;
    std::call_once(run->plan_once, [&run, this] {
      build_plan(*run, run->plan);
      if (!run->plan.usable)
        build_node_plan(*this, *run, run->nodes);
    });
    if (run->nodes.usable && merge_buffers_fit(run->nodes)) {
      install_parts(run);
      std::lock_guard in_order{run->nodes.send_mu};
      const uint64_t n = st->replays.fetch_add(1, std::memory_order_relaxed) + 1;
      replay_events out;
      replay_on_nodes(run, n, out);
      out.round_id_ = st->id;
      return out;
    }
    if (run->plan.usable && merge_buffers_fit(*run)) {
      const uint64_t n = st->replays.fetch_add(1, std::memory_order_relaxed) + 1;
      replay_events out;
      try {
        replay_on_devices(*this, run, n, out);
        out.round_id_ = st->id;
        return out;
      } catch (const device_error&) {
        // A device failed or stopping refuses the whole push, where its
        // `free_pool` call would release the pool at once and succeed:
        // a round with pool calls goes call by call then (the tables are
        // as before), as the calls would run.
        if (!run->plan.pools)
          throw;
        retry = n;
      }
    }
  }
  // When an item is refused part way too, the backend keeps the round while
  // the wrapped items pushed so far may run.
  struct keep_on_throw {
    detail::backend_impl& impl;
    const std::shared_ptr<detail::round_state>& st;
    const replay_events& out;
    bool kept = false;
    ~keep_on_throw() {
      if (!kept)
        detail::keep_for_replays(impl, st, out.items_);
    }
  };
  const uint64_t n = retry ? *retry : st->replays.fetch_add(1, std::memory_order_relaxed) + 1;
  replay_events out;
  out.round_id_ = st->id;
  keep_on_throw guard{*impl_, st, out};
  out.items_.reserve(st->items.size());
  using kind = detail::round_item::kind;
  std::optional<context> ctx_tmp, src_tmp; // a moved wait's or copy's contexts
  for (std::size_t i = 0; i < st->items.size(); ++i) {
    const auto& it = st->items[i];
    const auto& dev = image(m, it.dev);
    auto& rec = record_of(dev);
    try {
      switch (it.k) {
      case kind::task: {
        task t{it.work.description,
               detail::replayed_task{st.get(), static_cast<uint32_t>(i), static_cast<uint32_t>(n)},
               nullptr, it.work.kind}; // the round keeps the recorded keep_alive
        auto& c = detail::local_core(rec, "replay", "a closure cannot travel there");
        out.items_.emplace_back(rec.r.endpoint(), c.push(std::move(t)));
        break;
      }
      case kind::named:
        if (auto* c = rec.r.local_core()) {
          auto bound = detail::bind_spec(rec.r.core(), it.spec);
          bound.work.work = detail::with_provenance{std::move(bound.work.work), st.get(), i, n};
          out.items_.emplace_back(rec.r.endpoint(), c->push(std::move(bound.work)));
        } else {
          // An attached device: the run of named items on it, as one batch
          // (one message instead of a round trip per task). A remap maps no
          // two devices of the round to one, so the run is the same there.
          std::size_t j = i + 1;
          while (j < st->items.size() && st->items[j].k == kind::named
                 && st->items[j].dev == it.dev)
            ++j;
          if (j == i + 1) {
            out.items_.push_back(schedule_named(dev, it.spec));
          } else {
            std::vector<task_spec> specs;
            specs.reserve(j - i);
            for (auto k = i; k < j; ++k)
              specs.push_back(st->items[k].spec);
            for (auto& e : schedule_batch(dev, specs))
              out.items_.push_back(std::move(e));
            i = j - 1;
          }
        }
        break;
      case kind::wait:
        will_wait_for(image(m, it.ctx, ctx_tmp), it.on_item ? out.items_[*it.on_item] : it.on);
        out.items_.push_back(all_work(dev));
        break;
      case kind::run: {
        routine rr = it.r; // check_remap refuses moving it
        rr.schedule.work = detail::with_provenance{std::move(rr.schedule.work), st.get(), i, n};
        out.items_.push_back(run(rr));
        break;
      }
      case kind::copy:
        out.items_.push_back(detail::copy_step(*this, it.node, it.into,
                                              image(m, it.ctx, ctx_tmp),
                                              image(m, it.src, src_tmp)));
        break;
      case kind::memset: {
        auto& ep = impl_->endpoint_of(dev);
        out.items_.emplace_back(ep.shared_from_this(),
                               ep.memset_zero(it.pool_id, it.offset, it.size));
        break;
      }
      case kind::alloc_pool:
        alloc_pool(dev, it.pool_id, it.size, it.alignment, it.mode);
        out.items_.push_back(all_work(dev));
        break;
      case kind::free_pool:
        free_pool(dev, it.pool_id);
        out.items_.push_back(all_work(dev));
        break;
      }
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(
        fmt::format("replay: {}: {}", detail::provenance(*st, n, i), e.what()));
    }
  }
  out.all_work_.reserve(st->devices.size());
  for (const auto& d : st->devices)
    out.all_work_.emplace_back(image(m, d), all_work(image(m, d)));
  detail::keep_for_replays(*impl_, st, out.items_);
  guard.kept = true;
  return out;
}

} // namespace multidev
