// `backend`: one instance of the Multidev signature.
#include "multidev/backend.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <fmt/format.h>

#include <atomic>
#include <exception>
#include <stdexcept>
#include <thread>

#include "actors/backend_impl.hpp"
#include "actors/binding.hpp"
#include "actors/device_actor.hpp"
#include "actors/endpoint.hpp"
#include "actors/logger_tie.hpp"
#include "actors/round_state.hpp"
#include "actors/wait_graph.hpp"
#include "devices/registry.hpp"
#include "multidev/protocol.hpp"

namespace multidev {

using detail::record_of;

namespace {
std::atomic<int> next_device_id{1};
/// How long `get_global_debug_info` waits for the devices of nodes.
constexpr std::chrono::seconds debug_info_deadline{1};
} // namespace

// -- backend --------------------------------------------------------------------

namespace {

std::unique_ptr<detail::backend_impl> make_impl(backend_options opts) {
  auto& make_driver = detail::find_driver(opts.driver); // names the known ones
  if (opts.num_devices && *opts.num_devices < 0)
    throw std::invalid_argument(
      fmt::format("num_devices must be >= 0, got {}", *opts.num_devices));
  auto impl = std::make_unique<detail::backend_impl>();
  impl->drv = make_driver({.num_devices = opts.num_devices});
  impl->trace_file = detail::trace_file_from_environment(opts);
  impl->opts = std::move(opts);
  return impl;
}

} // namespace

backend::backend(backend_options opts) : impl_(make_impl(std::move(opts))) {
  impl_->own_cfg = std::make_unique<caf::actor_system_config>();
  auto threads = impl_->opts.scheduler_threads > 0
                   ? impl_->opts.scheduler_threads
                   : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The work-sharing scheduler sleeps on a condition variable when idle: an
  // idle backend costs next to no CPU (the default work-stealing workers poll
  // every few microseconds, ~1 % of a core for 8 devices here), and its
  // remote hops are faster (NOTES.md). The local hot path does not go through
  // CAF's scheduler at all. The middleman and heartbeats let it attach
  // nodes (configure_system).
  configure_system(*impl_->own_cfg);
  detail::mark_system_threads(*impl_->own_cfg); // see ~backend
  impl_->own_cfg->set("scheduler.max-threads", static_cast<size_t>(threads));
  // Built on a helper thread, so that no caller thread stays tied to the
  // system's logger (see logger_tie_guard): the backend may be destroyed on
  // any thread.
  std::exception_ptr failure;
  std::thread([this, &failure] {
    try {
      impl_->own_sys = std::make_unique<caf::actor_system>(*impl_->own_cfg);
    } catch (...) {
      failure = std::current_exception();
    }
  }).join();
  if (failure)
    std::rethrow_exception(failure);
  impl_->sys = impl_->own_sys.get();
  impl_->node = node_ref{caf::to_string(impl_->sys->node())};
}

backend::backend(caf::actor_system& sys, backend_options opts)
  : impl_(make_impl(std::move(opts))) {
  impl_->sys = &sys;
  impl_->node = node_ref{caf::to_string(sys.node())};
}

backend::~backend() {
  // Here, or on the reaper's thread when the teardown would wait for this
  // one (a task of this backend, a handler on its own actor system).
  detail::destroy(std::move(impl_));
}

const std::string& backend::name() const {
  return impl_->drv->backend_name();
}

caf::actor_system& backend::system() const {
  return *impl_->sys;
}

// Host pool calls go to the device's state directly, as schedule_task does:
// no CAF round trip (~70 us). Actors keep the messages. An attached device
// of another process gets them as requests to its actor.

void backend::alloc_pool(const device& d, int pool_id, std::size_t size_in_bytes,
                         std::size_t alignment, std::optional<memory_mode> mode) {
  if (detail::current_capture) [[unlikely]]
    return detail::record_pool_call(*impl_, detail::round_item::kind::alloc_pool, d, pool_id, 0,
                                    size_in_bytes, alignment, mode);
  impl_->endpoint_of(d).alloc_pool(pool_id, size_in_bytes, alignment, mode);
}

void backend::free_pool(const device& d, int pool_id) {
  if (detail::current_capture) [[unlikely]]
    return detail::record_pool_call(*impl_, detail::round_item::kind::free_pool, d, pool_id, 0, 0,
                                    0, std::nullopt);
  impl_->endpoint_of(d).free_pool(pool_id);
}

void backend::memset_zero(const device& d, int pool_id, std::size_t offset,
                          std::size_t size_in_bytes) {
  if (detail::current_capture) [[unlikely]]
    return detail::record_pool_call(*impl_, detail::round_item::kind::memset, d, pool_id, offset,
                                    size_in_bytes, 0, std::nullopt);
  impl_->endpoint_of(d).memset_zero(pool_id, offset, size_in_bytes);
}

void backend::flush(const device& d) const {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("flush", "it waits for a round trip now; flush after replay");
  impl_->endpoint_of(d).flush();
}

device backend::make_device(const multidev::dev& dv, const runner& r, int ordinal) {
  if (!r.endpoint())
    throw std::invalid_argument("make_device: empty runner");
  {
    // A runner lives and dies with the backend that made (or attached) it:
    // a device record here on another backend's runner would stop working
    // when that backend goes.
    std::lock_guard guard{impl_->mu};
    bool ours = r.local_core() ? impl_->actor_of.contains(r.local_core())
                               : impl_->attached.contains(r.key())
                                   && impl_->attached.at(r.key()).get_runner() == r;
    if (!ours)
      throw std::invalid_argument(fmt::format(
        "make_device: the runner of {} belongs to another backend; a device can "
        "only be made on a runner of this backend ({})",
        r.endpoint()->name(), name()));
  }
  auto rec = std::make_shared<detail::device_record>();
  rec->dv = dv;
  rec->ordinal = ordinal;
  rec->device_id = next_device_id.fetch_add(1);
  rec->r = r;
  rec->name = fmt::format("{}:{}:{}", name(), ordinal, rec->device_id);
  device d{std::move(rec)};
  std::lock_guard guard{impl_->mu};
  impl_->made.push_back(d);
  return d;
}

device backend::get_device(int ordinal) {
  auto n = num_devices();
  if (n == 0)
    throw std::invalid_argument(fmt::format(
      "get_device: ordinal {} is out of range: {} has no devices", ordinal, name()));
  if (ordinal < 0 || ordinal >= n)
    throw std::invalid_argument(fmt::format(
      "get_device: ordinal {} is out of range: {} has {} device{} (ordinals 0..{})",
      ordinal, name(), n, n == 1 ? "" : "s", n - 1));
  std::lock_guard guard{impl_->mu};
  // The ordinals after the local devices are the attached nodes' devices.
  auto local = impl_->drv->device_count();
  if (ordinal >= local)
    return impl_->node_devices.at(static_cast<std::size_t>(ordinal - local));
  if (impl_->devices.empty()) {
    impl_->devices.resize(static_cast<std::size_t>(local));
  }
  auto& slot = impl_->devices[static_cast<std::size_t>(ordinal)];
  if (slot)
    return slot;
  auto rec = std::make_shared<detail::device_record>();
  rec->dv = multidev::dev{impl_->opts.driver, ordinal};
  rec->ordinal = ordinal;
  rec->device_id = next_device_id.fetch_add(1);
  rec->name = fmt::format("{}:{}:{}", name(), ordinal, rec->device_id);
  auto core = std::make_shared<detail::device_core>(
    rec->name, ordinal, impl_->drv, impl_->opts.queue_capacity, impl_->results,
    impl_->opts.trace_capacity, impl_->opts.max_in_flight, impl_->opts.hand_over,
    impl_->opts.pin_runners && local >= 2); // one device: no runner waits on another
  if (impl_->lease)
    core->life().set_lease(impl_->lease, impl_->lease_why);
  if (impl_->guard)
    impl_->guard->count(core); // the session's memory quota
  auto id = static_cast<uint32_t>(rec->device_id);
  device_actor a;
  {
    detail::logger_tie_guard untie; // spawning ties this thread to the system
    a = detail::spawn_device_actor(*impl_->sys, core, {id, impl_->opts.driver}, impl_->guard);
  }
  rec->r = runner{detail::make_local_endpoint(device_key{impl_->node, id}, core, a.address())};
  slot = device{rec};
  impl_->made.push_back(slot);
  impl_->actor_of.emplace(core.get(), a);
  return slot;
}

int backend::num_devices() const {
  std::lock_guard guard{impl_->mu};
  return impl_->drv->device_count() + static_cast<int>(impl_->node_devices.size());
}

context backend::make_context(const device& d, ctx_buffers buffers, optimize_ctx opt) {
  record_of(d);
  context c;
  c.device = d;
  c.buffers = std::move(buffers);
  c.optimize = std::move(opt);
  return c;
}

context backend::make_child(const context& ctx, std::optional<ctx_buffers> buffers,
                            std::optional<optimize_ctx> opt,
                            std::optional<std::optional<tnode>> merge_buffer_node) {
  context c;
  c.device = ctx.device;
  c.parent = std::make_shared<const context>(ctx);
  c.buffers = buffers ? std::move(*buffers) : ctx.buffers;
  c.optimize = opt ? std::move(*opt) : ctx.optimize;
  c.merge_buffer_node = merge_buffer_node ? *merge_buffer_node : ctx.merge_buffer_node;
  return c;
}

std::string backend::get_name(const device& d) const {
  return d.name();
}

void backend::sync(const event& e) const {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("sync", "it waits now; sync the replay's events after replay");
  e.sync();
}

void backend::sync(const event& e, std::chrono::steady_clock::time_point deadline) const {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("sync", "it waits now; sync the replay's events after replay");
  e.sync(deadline);
}

void backend::sync(const event& e, std::chrono::steady_clock::duration timeout) const {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("sync", "it waits now; sync the replay's events after replay");
  e.sync(std::chrono::steady_clock::now() + timeout);
}

bool backend::is_done(const event& e) const {
  return e.is_done();
}

event_state backend::state(const event& e) const {
  if (auto& c = e.core())
    return c->outcomes().state(e.seq());
  auto ep = e.endpoint();
  if (!ep) {
    if (e.key() == device_key{})
      return event_state::done; // the default event
    throw std::invalid_argument(fmt::format(
      "state: no device of this process has the key of {} (attach its device first)",
      to_sexp(e).to_string()));
  }
  return ep->state(e.seq());
}

void backend::cancel(const device& d) {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("cancel", "it drops work now, not at each replay; cancel outside the record");
  record_of(d).ep().cancel();
}

bool backend::recover(const device& d) {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("recover", "it brings a device back now, not at each replay; recover outside the record");
  return record_of(d).ep().recover();
}

void backend::will_wait_for(const context& ctx, const event& e) {
  if (detail::current_capture) [[unlikely]]
    return detail::record_wait(*impl_, ctx, e);
  auto& w = record_of(ctx.device).r;
  // The hot path: both devices in this process.
  if (auto* c = w.local_core())
    if (auto& owner = e.core()) {
      c->push_wait(owner, e.seq());
      return;
    }
  auto owner = e.endpoint();
  if (!owner) {
    if (e.key() == device_key{})
      return; // the default event is done
    throw std::invalid_argument(fmt::format(
      "will_wait_for: no device of this process has the key of {} (attach its device "
      "first)",
      to_sexp(e).to_string()));
  }
  detail::wait_for(*w.endpoint(), *owner, e.seq());
}

sexp backend::static_properties() const {
  auto props = impl_->drv->properties();
  std::lock_guard guard{impl_->mu};
  if (impl_->nodes.empty())
    return props;
  // The attached nodes' devices, with their ordinals here and their names
  // ("<node>/<name there>").
  auto nodes = sexp::list({sexp::atom("nodes")});
  for (const auto& n : impl_->nodes) {
    auto node = sexp::list({sexp::atom("node"), sexp::field("name", n.name),
                            sexp::field("address", n.address)});
    for (const auto& d : n.devices)
      node.push_back(sexp::list({sexp::atom("device"),
                                 sexp::field("ordinal", std::to_string(d.ordinal())),
                                 sexp::field("name", d.name())}));
    nodes.push_back(std::move(node));
  }
  props.push_back(std::move(nodes));
  return props;
}

multidev::hardware_limits backend::hardware_limits() const {
  return impl_->drv->limits();
}

std::size_t backend::get_used_memory(const device& d) const {
  return record_of(d).ep().used_memory();
}

sexp backend::get_global_debug_info() const {
  auto devs = sexp::list({sexp::atom("devices")});
  std::vector<device> all;
  std::vector<device> attached;
  {
    std::lock_guard guard{impl_->mu};
    all = impl_->made;
    for (auto& [key, d] : impl_->attached)
      attached.push_back(d);
  }
  // A device of another process answers by message; one that cannot (its
  // node is gone) is listed with the error instead of failing the whole.
  auto info_of = [this](const device& d) {
    if (d.is_local())
      return get_debug_info(d);
    try {
      return get_debug_info(d);
    } catch (const std::exception& e) {
      return sexp::list({sexp::atom("device"), sexp::field("name", d.name()),
                         sexp::field("error", e.what())});
    }
  };
  for (const auto& d : all)
    devs.push_back(info_of(d));
  auto info = sexp::list({sexp::atom(name()),
                          sexp::field("num_devices", std::to_string(num_devices())),
                          sexp::field("devices_in_use", std::to_string(all.size())), devs});
  if (!attached.empty()) {
    // Asked all at once, answers waited for until one deadline: a silent
    // node is listed as silent (for how long) instead of holding the call.
    // Each device of a node lists its part of the node's wait-for graph.
    auto deadline = std::chrono::steady_clock::now() + debug_info_deadline;
    std::vector<std::function<sexp()>> answers;
    for (const auto& d : attached)
      answers.push_back(record_of(d).ep().debug_info_until(deadline));
    auto remote = sexp::list({sexp::atom("attached")});
    for (auto& answer : answers)
      remote.push_back(answer());
    info.push_back(std::move(remote));
  }
  // Who waits on what, now: the gates of this backend's devices and every
  // thread of the process blocked in sync or await.
  std::vector<std::shared_ptr<detail::device_core>> cores;
  for (const auto& d : all)
    if (auto ep = record_of(d).r.endpoint(); ep && ep->core())
      cores.push_back(ep->core());
  info.push_back(detail::wait_graph_info(cores));
  return info;
}

sexp backend::get_debug_info(const device& d) const {
  auto& rec = record_of(d);
  auto info = rec.ep().debug_info();
  info.push_back(sexp::field("device_id", std::to_string(d.device_id())));
  if (!rec.r.is_local())
    info.push_back(sexp::field("node", rec.r.key().node.str()));
  return info;
}

void backend::await(const device& d) const {
  await(d, std::chrono::steady_clock::time_point::max());
}

void backend::await(const device& d, std::chrono::steady_clock::duration timeout) const {
  await(d, std::chrono::steady_clock::now() + timeout);
}

void backend::await(const device& d, std::chrono::steady_clock::time_point deadline) const {
  if (detail::current_capture) [[unlikely]]
    detail::refuse_in_round("await", "it waits now; await after replay");
  auto& rec = record_of(d);
  if (auto* c = rec.r.local_core()) {
    try {
      c->events().sync_until(c->queue().scheduled(), deadline, "await");
    } catch (const device_error&) {
      // The last item failed; a device recovered since is not failed, and
      // the failure stays on the items' own events.
      if (c->life().failed())
        throw;
    }
    // Failed (or killed) after its last item finished: it is failed all the same.
    c->life().throw_if_failed();
  } else {
    rec.ep().await_until(deadline);
  }
}

event backend::all_work(const device& d) const {
  if (detail::current_capture) [[unlikely]]
    return detail::recorded_all_work(*impl_, d);
  auto& rec = record_of(d);
  if (auto* c = rec.r.local_core())
    return event{rec.r.endpoint(), c->queue().scheduled()};
  return event{rec.r.endpoint(), rec.ep().all_work()};
}

bool backend::is_idle(const device& d) const {
  return record_of(d).ep().is_idle();
}

void backend::schedule_task(const device& d, task t) {
  if (detail::current_capture) [[unlikely]]
    return detail::record_task(*impl_, d, std::move(t));
  auto& rec = record_of(d);
  if (auto* c = rec.r.local_core()) {
    c->push(std::move(t));
    return;
  }
  detail::refuse_remote(rec, "schedule_task",
                        "a closure cannot travel there: schedule a kernel registered on its "
                        "node with schedule_named");
}

event backend::schedule_named(const device& d, const task_spec& spec) {
  if (detail::current_capture) [[unlikely]]
    return detail::record_named(*impl_, d, spec);
  auto& rec = record_of(d);
  return event{rec.r.endpoint(), rec.ep().schedule_named(spec)};
}

std::vector<event> backend::schedule_batch(const device& d, std::span<const task_spec> specs) {
  if (detail::current_capture) [[unlikely]]
    return detail::record_batch(*impl_, d, specs);
  auto& rec = record_of(d);
  auto seqs = rec.ep().schedule_batch(specs);
  std::vector<event> events;
  events.reserve(seqs.size());
  for (auto seq : seqs)
    events.push_back(event{rec.r.endpoint(), seq});
  return events;
}

std::optional<kernel_result> backend::result(const std::string& name) const {
  return impl_->results->get(name);
}

std::optional<kernel_result> backend::result(const device& d, const std::string& name) const {
  return record_of(d).ep().result(name);
}

device_actor device_actor_of(const backend& b, const device& d) {
  return b.impl().actor_for(d);
}

device attach_device(backend& b, const device_actor& a) {
  return b.impl().attach(a);
}

} // namespace multidev
