// Nodes, linking and transfers: SPEC §5.7 on top of the device cores.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <span>
#include <stdexcept>

#include "actors/backend_impl.hpp"
#include "actors/binding.hpp"
#include "actors/round_state.hpp"
#include "multidev/backend.hpp"
#include "multidev/kernels.hpp"

namespace multidev {

using detail::record_of;

namespace {

constexpr std::size_t node_alignment = 64;

constexpr const char* use_named =
  "schedule its kernels with schedule_named (buffer arguments are locations in its "
  "pools: alloc_node gives them)";
constexpr const char* no_host_memory =
  "host memory cannot be copied to or from it here: write and read its nodes with "
  "kernels scheduled by schedule_named";

constexpr const char* no_copy =
  "copies between processes are not supported: run a kernel on each side";

/// `d`'s record, refusing a device of another process for `what`.
detail::device_record& local_record(const device& d, const char* what, const char* instead) {
  auto& rec = record_of(d);
  detail::local_core(rec, what, instead);
  return rec;
}

std::string node_name(const tnode& t) {
  return t.label.empty() ? fmt::format("#{}", t.id) : fmt::format("'{}' (#{})", t.label, t.id);
}

/// The pool behind `loc` on `core`, checked to hold `size` bytes at the offset.
std::shared_ptr<detail::pool> pool_for(detail::device_core& core, const tnode& t,
                                       const buffer_loc& loc, const char* what) {
  // The error text only when there is an error: this is on every copy's path.
  if (auto p = core.pools().find(loc.pool_id);
      p && loc.offset <= p->size && t.size_in_bytes <= p->size - loc.offset)
    return p;
  return core.pools().span(loc.pool_id, loc.offset, t.size_in_bytes,
                        fmt::format("{}: node {}", what, node_name(t)));
}

void check_size(const tnode& t, std::size_t n, const char* what) {
  if (n != t.size_in_bytes)
    throw std::invalid_argument(
      fmt::format("{}: node {} has {} bytes but the host buffer has {}", what,
                  node_name(t), t.size_in_bytes, n));
}

/// Whether a reader (a copy of this process) is resolved: done, failed or
/// cancelled. A reader that failed reads no more, like one that finished.
bool read_over(const event& e) {
  const auto& c = e.core();
  return c ? e.seq() <= c->outcomes().finished() : e.is_done();
}

/// Drops the readers that are over, so the lists stay short.
void prune(std::vector<event>& evs) {
  std::erase_if(evs, read_over);
}

/// Locks one record, or two in a deadlock-free order (`b` may be null or `a`).
class record_locks {
public:
  record_locks(detail::device_record& a, detail::device_record* b)
    : a_{a.mu, std::defer_lock} {
    if (b && b != &a) {
      b_ = std::unique_lock{b->mu, std::defer_lock};
      std::lock(a_, b_);
    } else {
      a_.lock();
    }
  }
  void unlock() {
    a_.unlock();
    if (b_.owns_lock())
      b_.unlock();
  }

private:
  std::unique_lock<detail::spin_mutex> a_, b_;
};

/// A wait a step needs: on what, and whether its failure carries.
struct unmet_wait {
  event e;
  detail::wait_kind kind;
};

/// What a step must wait for before it runs on `core` (`dst`'s): the last
/// writers of its `inputs` on the source device (read-after-write: their
/// failure fails the step), and copies on other devices still reading the
/// `outputs` it overwrites (write-after-read: ordering only, since a reader
/// that failed or was cancelled reads no more); less what is done (a reader:
/// resolved) and what runs on `core` anyway (FIFO). One wait per event, a
/// data one when it is both. Call with both records locked.
template <class Inputs, class Outputs>
std::vector<unmet_wait> unmet_waits(const Inputs& inputs, const Outputs& outputs,
                                    const detail::device_record& dst,
                                    const detail::device_record* src,
                                    const detail::device_core& core) {
  std::vector<unmet_wait> out;
  auto add = [&](const event& e, detail::wait_kind kind) {
    auto same = [&e](const unmet_wait& x) { return x.e == e; };
    if (e.core().get() != &core && std::none_of(out.begin(), out.end(), same))
      out.push_back({e, kind});
  };
  if (src)
    for (const auto& t : inputs)
      if (auto i = src->updating_for.find(t); i != src->updating_for.end())
        if (!i->second.is_done())
          add(i->second, detail::wait_kind::data);
  for (const auto& t : outputs)
    if (auto i = dst.readers.find(t); i != dst.readers.end())
      for (const auto& e : i->second)
        if (!read_over(e))
          add(e, detail::wait_kind::order);
  return out;
}

} // namespace

/// Moves `e` to seq `seq` of the device `ep` reaches. When `e` is already an
/// event of that endpoint (a node's last writer on the same device, the
/// common case) only its seq changes: no reference count is touched, where
/// a new event would take the endpoint's count and drop the old one's.
struct detail::event_access {
  static void advance(event& e, const std::shared_ptr<detail::endpoint>& ep, uint64_t seq) {
    if (e.ep_ == ep && ep) {
      e.seq_ = seq;
      return;
    }
    e = event{ep, seq};
  }
};

namespace {

/// Records a step pushed at `seq` on `rec`'s device (with both records
/// locked) as the writer of `outputs` there, a reader of `inputs` on `src`,
/// and, a copy into the merge buffer (`outputs` empty), its holder.
template <class Inputs, class Outputs>
void record_step(detail::device_record& rec, const Inputs& inputs, const Outputs& outputs,
                 detail::device_record* src, const std::optional<tnode>& merge_buffer_node,
                 uint64_t seq) {
  const auto& ep = rec.r.endpoint();
  for (const auto& t : outputs) {
    rec.readers.erase(t); // all waited for, or done
    detail::event_access::advance(rec.updating_for[t], ep, seq);
  }
  if (src && merge_buffer_node && std::empty(outputs))
    rec.updating_for_merge_buffer.emplace(*merge_buffer_node, event{ep, seq});
  if (src && src != &rec)
    for (const auto& t : inputs) {
      auto& readers = src->readers[t];
      prune(readers);
      readers.emplace_back(ep, seq);
    }
}

/// Pushes the step onto `rec`'s device after what it must wait for
/// (`push(core)` appends it without waiting for room and returns its seq),
/// and records it as the writer of `outputs` and a reader of `inputs` on
/// `src`: the part of `backend::run` after its checks, shared with the host
/// copies (which need no routine, so copy no context). `merge_buffer_node`:
/// a copy into the destination's merge buffer (with `outputs` empty) holds it.
/// Returns the step's seq on `rec`'s device: a host copy, which returns no
/// event, builds none.
template <class Push, class Inputs, class Outputs>
uint64_t schedule_step(detail::device_record& rec, Push&& push, const Inputs& inputs,
                       const Outputs& outputs, detail::device_record* src,
                       const std::optional<tnode>& merge_buffer_node) {
  auto& core = rec.r.core();
  // One step per call, serial with every other transfer touching the same
  // records: compute the waits, push the task, record the writer/readers, all
  // under the records' locks (else a writer pushed between our push and our
  // record is forgotten, and a later copy reads its half-written node).
  // Nothing under the locks may wait for room in a queue: a task on a runner
  // may call a transfer itself, and that runner would then never drain.
  // Backpressure first, outside the locks; the pushes below never wait, so a
  // queue can exceed its capacity by a few entries per caller racing for the
  // same room.
  core->wait_for_room();
  record_locks locks{rec, src};
  for (const auto& w : unmet_waits(inputs, outputs, rec, src, *core))
    core->push_wait(w.e.core(), w.e.seq(), w.kind); // never waits for room
  const uint64_t seq = push(*core);
  record_step(rec, inputs, outputs, src, merge_buffer_node, seq);
  return seq;
}

} // namespace

detail::routine_push::routine_push(std::span<const routine* const> routines,
                                   std::span<device_core* const> lanes, bool may_wait,
                                   std::span<const uint8_t> written_in_round)
  : routines_(routines) {
  if (may_wait)
    for (auto* c : lanes)
      c->wait_for_room();
  for (const auto* r : routines) {
    locked_.push_back(&record_of(r->context.device));
    if (r->copy_source)
      locked_.push_back(&record_of(r->copy_source->device));
  }
  std::sort(locked_.begin(), locked_.end());
  locked_.erase(std::unique(locked_.begin(), locked_.end()), locked_.end());
  for (auto* rec : locked_)
    rec->mu.lock();
  try {
    for (std::size_t k = 0; k < routines.size(); ++k) {
      const auto* r = routines[k];
      auto& rec = record_of(r->context.device);
      auto* src = r->copy_source && (written_in_round.empty() || !written_in_round[k])
                    ? &record_of(r->copy_source->device)
                    : nullptr;
      auto& core = rec.r.core();
      for (const auto& w : unmet_waits(r->inputs, r->outputs, rec, src, *core))
        core->push_wait(w.e.core(), w.e.seq(), w.kind); // never waits for room
    }
  } catch (...) {
    for (auto* rec : locked_)
      rec->mu.unlock();
    throw;
  }
}

void detail::routine_push::check_pins(const routine& r) {
  for (const auto& pin : r.pinned_pools)
    if (pin.core->pools().find(pin.pool_id) != pin.pool)
      throw std::invalid_argument(fmt::format(
        "run: routine '{}' uses pool {} of {}, which was freed or replaced after linking; "
        "link it again",
        r.name, pin.pool_id, pin.core->name()));
}

detail::routine_push::~routine_push() {
  for (auto it = locked_.rbegin(); it != locked_.rend(); ++it)
    (*it)->mu.unlock();
}

void detail::routine_push::wrote(std::size_t k, uint64_t seq) {
  const auto& r = *routines_[k];
  record_step(record_of(r.context.device), r.inputs, r.outputs,
              r.copy_source ? &record_of(r.copy_source->device) : nullptr,
              r.context.merge_buffer_node, seq);
}

namespace {

/// Where a node was placed by `place_node`.
struct placed_node {
  context ctx;
  enum { held, cached, allocated } how;
};

/// Enters a newly allocated constant in its device's cache; a constant that
/// another thread entered first stays (ours remains a private copy).
void publish_constant(detail::device_record& rec, const tnode& t, const buffer_loc& loc) {
  if (t.mode != memory_mode::effectively_constant)
    return;
  std::lock_guard guard{rec.mu};
  rec.constant_buffer_cache.emplace(t, loc);
}

/// `ctx` when it holds `t`; else a child holding the device's cached
/// constant, or a new pool (`publish`: entered in the constant cache at once).
/// Threads placing the same node race benignly: each new pool gets its own id.
placed_node place_node(backend& b, const context& ctx, const tnode& t, bool publish) {
  if (ctx.buffers.contains(t))
    return {ctx, placed_node::held};
  auto& rec = record_of(ctx.device);
  ctx_buffers bufs = ctx.buffers;
  if (t.mode == memory_mode::effectively_constant) {
    if (auto loc = ctx.device.constant_buffer(t)) {
      bufs[t] = *loc;
      return {b.make_child(ctx, std::move(bufs)), placed_node::cached};
    }
  }
  int id;
  {
    std::lock_guard guard{rec.mu};
    id = rec.next_pool_id++;
  }
  b.alloc_pool(ctx.device, id, t.size_in_bytes, node_alignment, t.mode);
  bufs[t] = buffer_loc{id, 0};
  if (publish)
    publish_constant(rec, t, buffer_loc{id, 0});
  return {b.make_child(ctx, std::move(bufs)), placed_node::allocated};
}

} // namespace

// A constant placed here is cached before anything writes it: the caller
// writes it before other threads may use it. The init_* functions below
// enter it only once its write is scheduled.
context backend::alloc_node(const context& ctx, const tnode& t) {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("alloc_node", "it allocates and enters the node in the constant cache now; allocate nodes before recording (alloc_pool is recorded)");
  return place_node(*this, ctx, t, true).ctx;
}

routine backend::link(const context& ctx, const std::string& kernel,
                      const std::vector<link_arg>& args) {
  auto& rec = local_record(ctx.device, "link", use_named);
  auto def = find_kernel(kernel);
  if (!def)
    throw std::invalid_argument(fmt::format("link: unknown kernel '{}' (known: {})", kernel,
                                            fmt::join(kernel_names(), ", ")));
  if (args.size() != def->params.size())
    throw std::invalid_argument(fmt::format("link: kernel '{}' takes {} arguments, got {}",
                                            kernel, def->params.size(), args.size()));
  routine r;
  r.context = ctx;
  r.name = kernel;
  task_spec spec{kernel, {}};
  std::vector<const tnode*> nodes(args.size(), nullptr);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (auto* t = std::get_if<tnode>(&a)) {
      nodes[i] = t;
      if (def->params[i] != arg_kind::buffer)
        throw std::invalid_argument(fmt::format(
          "link: kernel '{}' argument {}: expected {}, got node {}", kernel, i,
          to_string(def->params[i]), node_name(*t)));
      if (static_cast<int>(i) == def->merge_buffer_param) {
        if (!ctx.merge_buffer_node || !(*ctx.merge_buffer_node == *t))
          throw std::invalid_argument(fmt::format(
            "link: kernel '{}' reads node {} from the merge buffer, but the context's "
            "merge_buffer_node is {}",
            kernel, node_name(*t),
            ctx.merge_buffer_node ? node_name(*ctx.merge_buffer_node) : "none"));
        r.merge_buffer_input = *t;
        spec.args.emplace_back(buffer_arg{buffer_loc{0, 0}, t->size_in_bytes});
        continue;
      }
      auto loc = ctx.buffers.find(*t);
      if (loc == ctx.buffers.end())
        throw std::invalid_argument(fmt::format(
          "link: kernel '{}' argument {}: node {} is not in the context of {}", kernel,
          i, node_name(*t), rec.name));
      spec.args.emplace_back(buffer_arg{loc->second, t->size_in_bytes});
    } else {
      std::visit(
        [&spec](const auto& v) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(v)>, tnode>)
            spec.args.emplace_back(v);
        },
        a);
      // Checked here, in argument order, so the first bad argument is named.
      check_kernel_arg(kernel, i, def->params[i], spec.args.back());
    }
  }
  auto bound = detail::bind_spec(rec.r.core(), spec); // checks kinds, pools, ranges
  for (int i : def->reads)
    if (nodes[static_cast<std::size_t>(i)] && i != def->merge_buffer_param)
      r.inputs.insert(*nodes[static_cast<std::size_t>(i)]);
  for (int i : def->writes)
    if (nodes[static_cast<std::size_t>(i)])
      r.outputs.insert(*nodes[static_cast<std::size_t>(i)]);
  r.schedule = std::move(bound.work);
  for (auto& [id, p] : bound.pools)
    r.pinned_pools.push_back({rec.r.core(), id, p});
  return r;
}

event backend::run(const routine& r) {
  if (detail::current_capture) [[unlikely]]
    return detail::record_run(impl(), r);
  if (!r.schedule.work)
    throw std::invalid_argument(fmt::format(
      "run: routine '{}' has no task to run again (a copy across processes happens in "
      "device_to_device itself: call it again)",
      r.name));
  auto& rec = local_record(r.context.device, "run", use_named);
  detail::routine_push::check_pins(r);
  if (r.merge_buffer_input) {
    auto held = r.context.device.updating_for_merge_buffer();
    if (!held || !(held->first == *r.merge_buffer_input))
      throw std::invalid_argument(fmt::format(
        "run: routine '{}' reads node {} from the merge buffer of {}, which holds {}",
        r.name, node_name(*r.merge_buffer_input), rec.name,
        held ? node_name(held->first) : "nothing"));
  }
  auto* src = r.copy_source ? &record_of(r.copy_source->device) : nullptr;
  auto seq = schedule_step(
    rec, [&](detail::device_core& core) { return core.push(task{r.schedule}, false); },
    r.inputs, r.outputs, src, r.context.merge_buffer_node);
  return event{rec.r.endpoint(), seq};
}

/// Whether a transfer touches a device of another process: then its bytes
/// travel in messages (`write`/`read` of the device actors) instead of a
/// copy task on one runner.
static bool crosses_processes(const context& a, const context* b = nullptr) {
  return !a.device.is_local() || (b && !b->device.is_local());
}

/// The bytes of `t` in `ctx`, read after the work scheduled on its device
/// so far (which includes `t`'s last writer there); blocks until read.
static std::string read_node(backend& b, const context& ctx, const tnode& t, const char* what) {
  auto loc = ctx.buffers.find(t);
  if (loc == ctx.buffers.end())
    throw std::invalid_argument(fmt::format("{}: node {} is not in the context of {}", what,
                                            node_name(t), ctx.device.name()));
  return b.impl().endpoint_of(ctx.device).read_bytes(loc->second.pool_id, loc->second.offset,
                                                     t.size_in_bytes);
}

/// Writes `bytes` into `loc` of `d` as ordered work; returns its event.
static event write_bytes(backend& b, const device& d, const buffer_loc& loc, std::string bytes) {
  auto& ep = b.impl().endpoint_of(d);
  auto seq = ep.write_bytes(loc.pool_id, loc.offset, std::move(bytes));
  return event{ep.shared_from_this(), seq};
}

/// Copies the bytes of `t` in `src` into `loc` of `dst`, a copy across
/// processes; returns the write's event on `dst`. Between two devices of
/// other processes the bytes go straight from one to the other: the write is
/// queued on `dst` now, the source reads after its work so far and sends
/// them, and this call waits for neither. Otherwise they pass through this
/// process: read from the source after its work so far (blocking until
/// read), then written to `dst` as ordered work.
static event move_bytes(backend& b, const context& src, const tnode& t, const device& dst,
                        const buffer_loc& loc) {
  auto& from = b.impl().endpoint_of(src.device);
  auto& to = b.impl().endpoint_of(dst);
  if (to.copies_directly(from)) {
    const auto& at = src.buffers.at(t);
    auto seq = to.copy_from(from, at.pool_id, at.offset, loc.pool_id, loc.offset, t.size_in_bytes);
    return event{to.shared_from_this(), seq};
  }
  return write_bytes(b, dst, loc, read_node(b, src, t, "device_to_device"));
}

/// A copy between `t`'s buffer in `ctx` and host memory, scheduled on
/// `ctx.device` as `run` would schedule the routine (after the node's
/// readers; as its writer, or as a reader): `to_device` writes the node,
/// otherwise it reads it. False when `ctx` does not hold `t`. The hot path of
/// small copies: no routine, so no copy of the context's buffer map.
static bool host_copy(const context& ctx, const tnode& t, std::byte* host, std::size_t n,
                      bool to_device) {
  const char* what = to_device ? "from_host" : "to_host";
  auto& rec = local_record(ctx.device, what, no_host_memory);
  auto& core = rec.r.core();
  auto loc = ctx.buffers.find(t);
  if (loc == ctx.buffers.end())
    return false;
  check_size(t, n, what);
  auto p = pool_for(*core, t, loc->second, what);
  std::byte* dev = p->base() + loc->second.offset;
  // Its description is built only if a trace or an error asks for it.
  detail::device_core::order order{to_device ? dev : host, to_device ? host : dev, n, what,
                                   t.id};
  auto push = [&](detail::device_core& c) {
    return c.push_order(order, trace_kind::copy, t.label, std::move(p));
  };
  const std::span<const tnode, 1> node{&t, 1}; // no copy of its label
  const std::span<const tnode, 0> none{};
  if (to_device)
    schedule_step(rec, push, none, node, nullptr, std::nullopt);
  else
    schedule_step(rec, push, node, none, nullptr, std::nullopt);
  return true;
}

bool backend::from_host(const context& ctx, const tnode& t, std::span<const std::byte> host) {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("from_host", "it reads host memory that a replay could not name again; copy from the host before recording, or from a device buffer inside the round");
  if (crosses_processes(ctx)) {
    // The bytes travel in the message: the host's may change once it returns.
    auto loc = ctx.buffers.find(t);
    if (loc == ctx.buffers.end())
      return false;
    check_size(t, host.size(), "from_host");
    auto done = write_bytes(*this, ctx.device, loc->second,
                            std::string(reinterpret_cast<const char*>(host.data()), host.size()));
    auto& rec = record_of(ctx.device);
    std::lock_guard guard{rec.mu};
    rec.updating_for[t] = done;
    return true;
  }
  // The copy only reads through this pointer.
  return host_copy(ctx, t, const_cast<std::byte*>(host.data()), host.size(), true);
}

context backend::init_from_host(const context& ctx, const tnode& t,
                                std::span<const std::byte> host) {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("init_from_host", "it allocates and reads host memory now; do it before recording");
  if (crosses_processes(ctx)) {
    check_size(t, host.size(), "init_from_host");
    auto c = ctx.buffers.contains(t) ? ctx : alloc_node(ctx, t);
    from_host(c, t, host);
    return c;
  }
  local_record(ctx.device, "init_from_host", no_host_memory);
  check_size(t, host.size(), "init_from_host");
  auto p = place_node(*this, ctx, t, false);
  // A cached constant already holds the data on this device.
  if (p.how != placed_node::cached)
    from_host(p.ctx, t, host);
  if (p.how == placed_node::allocated)
    publish_constant(record_of(p.ctx.device), t, p.ctx.buffers.at(t));
  return p.ctx;
}

bool backend::to_host(const context& ctx, const tnode& t, std::span<std::byte> host) {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("to_host", "it writes host memory the host then reads; read the results after replay, with to_host on the replay's events");
  if (crosses_processes(ctx)) {
    // Blocks until the bytes are here (after the device's work so far).
    if (!ctx.buffers.contains(t))
      return false;
    check_size(t, host.size(), "to_host");
    auto bytes = read_node(*this, ctx, t, "to_host");
    std::memcpy(host.data(), bytes.data(), bytes.size());
    return true;
  }
  return host_copy(ctx, t, host.data(), host.size(), false);
}

/// `device_to_device`, setting `copied` to the copy's event on `dst`.
static std::optional<routine> copy_node(backend& b, const tnode& t, merge_buffer_use into,
                                        const context& dst, const context& src,
                                        event& copied) {
  if (crosses_processes(dst, &src)) {
    // Across processes (`move_bytes`): read from the source after its work
    // so far (its writer of `t` included), then written to the destination
    // as ordered work there; straight between the two when both are devices
    // of other processes, through this host otherwise.
    if (!src.buffers.contains(t))
      return std::nullopt;
    if (into == merge_buffer_use::no && !dst.buffers.contains(t))
      return std::nullopt;
    routine r;
    r.name = fmt::format("device_to_device {} {} -> {}{} (across processes)", node_name(t),
                         src.device.name(), dst.device.name(),
                         into == merge_buffer_use::copy ? " (merge buffer)" : "");
    r.copy_source = std::make_shared<const context>(src);
    r.inputs.insert(t);
    auto& drec = record_of(dst.device);
    if (into == merge_buffer_use::no) {
      r.context = dst;
      r.outputs.insert(t);
      auto done = move_bytes(b, src, t, dst.device, dst.buffers.at(t));
      copied = done;
      std::lock_guard guard{drec.mu};
      drec.updating_for[t] = done;
    } else {
      bool grow;
      {
        std::lock_guard guard{drec.mu};
        grow = drec.merge_buffer_capacity < t.size_in_bytes;
      }
      if (grow) {
        b.alloc_pool(dst.device, 0, t.size_in_bytes, node_alignment, memory_mode::device_only);
        std::lock_guard guard{drec.mu};
        drec.merge_buffer_capacity = t.size_in_bytes;
      }
      r.context = b.make_child(dst, std::nullopt, std::nullopt, std::optional<tnode>{t});
      auto done = move_bytes(b, src, t, dst.device, buffer_loc{0, 0});
      copied = done;
      std::lock_guard guard{drec.mu};
      drec.updating_for_merge_buffer.emplace(t, done);
    }
    // No task to run again: `run` refuses it (call device_to_device again).
    r.schedule = task{r.name, nullptr, {}, trace_kind::copy};
    return r;
  }
  auto r = detail::local_copy(b, t, into, dst, src, true);
  if (r)
    copied = b.run(*r);
  return r;
}

std::optional<routine> detail::local_copy(backend& b, const tnode& t, merge_buffer_use into,
                                          const context& dst, const context& src,
                                          bool may_grow) {
  auto& srec = local_record(src.device, "device_to_device", no_copy);
  auto& drec = local_record(dst.device, "device_to_device", no_copy);
  auto sloc = src.buffers.find(t);
  if (sloc == src.buffers.end())
    return std::nullopt;
  auto dloc = dst.buffers.find(t);
  if (into == merge_buffer_use::no && dloc == dst.buffers.end())
    return std::nullopt;
  auto sp = pool_for(srec.core(), t, sloc->second, "device_to_device (source)");
  const std::byte* from = sp->base() + sloc->second.offset;
  auto n = t.size_in_bytes;
  auto& dcore = drec.r.core();
  auto* drv = &dcore->drv();
  routine r;
  r.name = fmt::format("device_to_device {} {} -> {}{}", node_name(t), srec.name,
                       drec.name, into == merge_buffer_use::copy ? " (merge buffer)" : "");
  r.copy_source = std::make_shared<const context>(src);
  r.inputs.insert(t);
  r.pinned_pools.push_back({srec.r.core(), sloc->second.pool_id, sp});
  if (into == merge_buffer_use::no) {
    auto dp = pool_for(*dcore, t, dloc->second, "device_to_device (destination)");
    std::byte* to = dp->base() + dloc->second.offset;
    r.context = dst;
    r.outputs.insert(t);
    r.pinned_pools.push_back({dcore, dloc->second.pool_id, dp});
    r.schedule = task{r.name, [drv, to, from, n] { drv->copy(to, from, n); },
                      std::make_shared<std::pair<std::shared_ptr<detail::pool>,
                                                 std::shared_ptr<detail::pool>>>(sp, dp),
                      trace_kind::copy};
  } else {
    // Grow the merge buffer when it is missing or too small (a replaced pool 0
    // lives until the work before it is done), then resolve pool 0 now: the
    // copy writes this pool even if pool 0 is freed or replaced before it
    // runs, as every pool change is ordered like cudaFreeAsync.
    auto mb = dcore->pools().find(0);
    bool grow;
    {
      std::lock_guard guard{drec.mu};
      grow = drec.merge_buffer_capacity < n || !mb || mb->size < n;
    }
    if (grow && !may_grow)
      throw std::invalid_argument(fmt::format(
        "device_to_device: the merge buffer of {} is smaller than node {} ({} bytes) and a "
        "replay pushed at once does not grow it",
        drec.name, node_name(t), n));
    if (grow) {
      b.alloc_pool(dst.device, 0, n, node_alignment, memory_mode::device_only);
      mb = dcore->pools().find(0);
      if (!mb || mb->size < n)
        throw std::invalid_argument(fmt::format(
          "device_to_device: the merge buffer of {} was freed or replaced while "
          "growing it to {} bytes for node {}",
          drec.name, n, node_name(t)));
      std::lock_guard guard{drec.mu};
      drec.merge_buffer_capacity = n;
    }
    r.context = b.make_child(dst, std::nullopt, std::nullopt, std::optional<tnode>{t});
    r.pinned_pools.push_back({dcore, 0, mb});
    std::byte* to = mb->base();
    r.schedule = task{r.name, [drv, to, from, n] { drv->copy(to, from, n); },
                      std::make_shared<std::pair<std::shared_ptr<detail::pool>,
                                                 std::shared_ptr<detail::pool>>>(sp, mb),
                      trace_kind::copy};
  }
  return r;
}

bool detail::merge_buffer_fits(const context& dst, const tnode& t) {
  auto& drec = record_of(dst.device);
  auto* core = drec.r.local_core();
  if (!core)
    return false;
  auto mb = core->pools().find(0);
  std::lock_guard guard{drec.mu};
  return drec.merge_buffer_capacity >= t.size_in_bytes && mb && mb->size >= t.size_in_bytes;
}

std::optional<routine> backend::device_to_device(const tnode& t, merge_buffer_use into,
                                                 const context& dst, const context& src) {
  if (detail::current_capture) [[unlikely]]
    return detail::record_copy(impl(), t, into, dst, src);
  event copied;
  return copy_node(*this, t, into, dst, src, copied);
}

event detail::copy_step(backend& b, const tnode& t, merge_buffer_use into, const context& dst,
                        const context& src) {
  event copied;
  if (!copy_node(b, t, into, dst, src, copied))
    throw std::invalid_argument(fmt::format(
      "device_to_device: node {} is not in the context of {} or of {}", node_name(t),
      src.device.name(), dst.device.name()));
  return copied;
}


context backend::init_from_device(const tnode& t, const context& dst, const context& src) {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("init_from_device", "it allocates the node now; allocate it before recording and record device_to_device");
  if (crosses_processes(dst, &src)) {
    if (!src.buffers.contains(t))
      throw std::invalid_argument(fmt::format(
        "init_from_device: node {} is not in the source context of {}", node_name(t),
        src.device.name()));
    auto c = dst.buffers.contains(t) ? dst : alloc_node(dst, t);
    device_to_device(t, merge_buffer_use::no, c, src);
    return c;
  }
  local_record(src.device, "init_from_device", no_copy);
  local_record(dst.device, "init_from_device", no_copy);
  if (!src.buffers.contains(t))
    throw std::invalid_argument(fmt::format("init_from_device: node {} is not in the source context of {}",
                                            node_name(t), src.device.name()));
  auto p = place_node(*this, dst, t, false);
  device_to_device(t, merge_buffer_use::no, p.ctx, src);
  if (p.how == placed_node::allocated)
    publish_constant(record_of(p.ctx.device), t, p.ctx.buffers.at(t));
  return p.ctx;
}

void backend::sync_device(const device& d) {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("sync_device", "it waits now; wait after replay");
  await(d);
  auto& rec = record_of(d);
  std::lock_guard guard{rec.mu};
  std::erase_if(rec.updating_for, [](const auto& kv) { return kv.second.is_done(); });
  for (auto& [t, evs] : rec.readers)
    prune(evs);
  std::erase_if(rec.readers, [](const auto& kv) { return kv.second.empty(); });
}

} // namespace multidev
