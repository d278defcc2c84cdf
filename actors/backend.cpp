#include "multidev/backend.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/exit_reason.hpp>
#include <caf/logger.hpp>

#include <fmt/format.h>

#include <atomic>
#include <exception>
#include <stdexcept>
#include <thread>

#include "actors/backend_impl.hpp"
#include "actors/binding.hpp"
#include "actors/device_actor.hpp"
#include "multidev/protocol.hpp"

namespace multidev {

namespace detail {

namespace {
std::atomic<int> next_device_id{1};

constexpr auto request_timeout = std::chrono::minutes(5);

/// CAF ties a thread to an actor system's logger (a thread-local reference)
/// whenever an actor (a scoped_actor too) or an actor_system is created on it,
/// and ~actor_system waits until every such reference is gone. Without this, a
/// host thread that once called `alloc_pool` (say) would keep the system from
/// shutting down from any other thread for as long as it lives. Unties the
/// thread again when it had no tie before.
class logger_tie_guard {
public:
  logger_tie_guard() : prev_(caf::logger::current_logger()) {
  }
  ~logger_tie_guard() {
    if (prev_ == nullptr && caf::logger::current_logger() != nullptr)
      caf::logger::set_current_actor_system(nullptr);
  }
  logger_tie_guard(const logger_tie_guard&) = delete;
  logger_tie_guard& operator=(const logger_tie_guard&) = delete;

private:
  caf::logger* prev_;
};
} // namespace

device_record& record_of(const device& d) {
  if (!d.record())
    throw std::invalid_argument("empty device handle (default-constructed device)");
  return *d.record();
}

device_core& backend_impl::core_of(const device& d) const {
  auto& rec = record_of(d);
  std::lock_guard guard{mu};
  if (!actor_of.contains(rec.r.core().get()))
    throw std::invalid_argument(
      fmt::format("device {} does not belong to this backend", rec.name));
  return rec.core();
}

device_actor backend_impl::actor_for(const device& d) const {
  auto& rec = record_of(d);
  std::lock_guard guard{mu};
  auto i = actor_of.find(rec.r.core().get());
  if (i == actor_of.end())
    throw std::invalid_argument(
      fmt::format("device {} does not belong to this backend", rec.name));
  return i->second;
}

template <class R, class... Ts>
R backend_impl::ask(const device& d, Ts... xs) const {
  auto a = actor_for(d);
  logger_tie_guard untie;
  caf::scoped_actor self{*sys};
  std::optional<R> result;
  caf::error err;
  self->request(a, request_timeout, xs...)
    .receive([&](R r) { result = std::move(r); }, [&](caf::error& e) { err = e; });
  if (err || !result)
    throw_error(err, record_of(d).name);
  return *result;
}

void backend_impl::shutdown() {
  std::vector<device> all;
  std::vector<device_actor> handles;
  {
    std::lock_guard guard{mu};
    all = made;
    for (auto& [core, a] : actor_of)
      handles.push_back(a);
    actor_of.clear();
  }
  // Finish accepted work first (waits between devices resolve through the
  // cores), then stop the actors. Every core stops accepting before any is
  // joined: a runner finishing its queue may be waiting on another device.
  for (auto& d : all)
    d.get_runner().core()->request_stop();
  for (auto& d : all)
    d.get_runner().core()->shutdown();
  for (auto& a : handles)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  handles.clear();
}

} // namespace detail

using detail::record_of;

// -- small handle types ---------------------------------------------------------

sexp to_sexp(const dev& d) {
  return sexp::list({sexp::atom("dev"), sexp::field("driver", d.driver),
                     sexp::field("ordinal", std::to_string(d.ordinal))});
}

runner::runner(std::shared_ptr<detail::device_core> core) : core_(std::move(core)) {
}

std::size_t runner::queue_length() const {
  return core_ ? core_->scheduled() - core_->finished() : 0;
}

sexp to_sexp(const runner& r) {
  if (!r.core())
    return sexp::list({sexp::atom("runner"), sexp::atom("none")});
  return sexp::list({sexp::atom("runner"), sexp::field("device", r.core()->name()),
                     sexp::field("queue_length", std::to_string(r.queue_length()))});
}

event::event(std::shared_ptr<detail::device_core> core, uint64_t seq)
  : core_(std::move(core)), seq_(seq) {
}

bool event::is_done() const {
  return !core_ || core_->is_done(seq_);
}

bool event::is_failed() const {
  return core_ && core_->is_failed(seq_);
}

void event::sync() const {
  if (core_)
    core_->sync(seq_);
}

std::string event::device_name() const {
  return core_ ? core_->name() : std::string{};
}

sexp to_sexp(const event& e) {
  std::string state = e.is_done() ? "done" : e.is_failed() ? "failed" : "pending";
  return sexp::list({sexp::atom("event"),
                     sexp::field("device", e.core() ? e.device_name() : "none"),
                     sexp::field("seq", std::to_string(e.seq())),
                     sexp::field("state", state)});
}

sexp to_sexp(const buffer_ptr& p) {
  return sexp::atom(fmt::format("{}", static_cast<const void*>(p)));
}

device::device(std::shared_ptr<detail::device_record> rec) : rec_(std::move(rec)) {
}

const dev& device::dev() const { return record_of(*this).dv; }
int device::ordinal() const { return record_of(*this).ordinal; }
int device::device_id() const { return record_of(*this).device_id; }
const runner& device::get_runner() const { return record_of(*this).r; }
const std::string& device::name() const { return record_of(*this).name; }

std::optional<buffer_ptr> device::merge_buffer() const {
  auto p = record_of(*this).core().try_pool(0);
  if (!p)
    return std::nullopt;
  return p->base();
}

std::size_t device::merge_buffer_capacity() const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  return rec.merge_buffer_capacity;
}

std::optional<event> device::updating_for(const tnode& t) const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  if (auto i = rec.updating_for.find(t); i != rec.updating_for.end())
    return i->second;
  return std::nullopt;
}

std::optional<std::pair<tnode, event>> device::updating_for_merge_buffer() const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  return rec.updating_for_merge_buffer;
}

std::optional<buffer_loc> device::constant_buffer(const tnode& t) const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  if (auto i = rec.constant_buffer_cache.find(t); i != rec.constant_buffer_cache.end())
    return i->second;
  return std::nullopt;
}

int device::next_pool_id() const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  return rec.next_pool_id;
}

sexp to_sexp(const device& d) {
  if (!d)
    return sexp::list({sexp::atom("device"), sexp::atom("none")});
  auto& rec = record_of(d);
  std::lock_guard guard{rec.mu};
  auto writers = sexp::list({sexp::atom("updating_for")});
  for (const auto& [t, e] : rec.updating_for)
    writers.push_back(sexp::list({sexp::atom(t.label), to_sexp(e)}));
  auto cache = sexp::list({sexp::atom("constant_buffer_cache")});
  for (const auto& [t, loc] : rec.constant_buffer_cache)
    cache.push_back(sexp::list({sexp::atom(t.label), to_sexp(loc)}));
  return sexp::list(
    {sexp::atom("device"), sexp::field("name", rec.name), to_sexp(rec.dv),
     sexp::field("ordinal", std::to_string(rec.ordinal)),
     sexp::field("device_id", std::to_string(rec.device_id)), to_sexp(rec.r),
     sexp::field("merge_buffer_capacity", std::to_string(rec.merge_buffer_capacity)),
     sexp::field("updating_for_merge_buffer",
                 rec.updating_for_merge_buffer
                   ? sexp::list({sexp::atom(rec.updating_for_merge_buffer->first.label),
                                 to_sexp(rec.updating_for_merge_buffer->second)})
                   : sexp::atom("none")),
     writers, cache, sexp::field("next_pool_id", std::to_string(rec.next_pool_id))});
}

sexp to_sexp(const context& c) {
  return sexp::list(
    {sexp::atom("context"), sexp::field("device", c.device ? c.device.name() : "none"),
     sexp::field("parent", c.parent ? "some" : "none"), to_sexp(c.buffers),
     sexp::field("finalized", c.finalized ? "true" : "false"), to_sexp(c.optimize),
     sexp::field("merge_buffer_node",
                 c.merge_buffer_node ? to_sexp(*c.merge_buffer_node) : sexp::atom("none"))});
}

// -- backend --------------------------------------------------------------------

namespace {

std::unique_ptr<detail::backend_impl> make_impl(backend_options opts) {
  if (opts.driver != "cpu")
    throw std::invalid_argument(
      fmt::format("unknown driver '{}' (this build has: cpu)", opts.driver));
  if (opts.num_devices && *opts.num_devices < 0)
    throw std::invalid_argument(
      fmt::format("num_devices must be >= 0, got {}", *opts.num_devices));
  auto impl = std::make_unique<detail::backend_impl>();
  impl->drv = detail::make_cpu_driver(opts.num_devices);
  impl->opts = std::move(opts);
  return impl;
}

} // namespace

backend::backend(backend_options opts) : impl_(make_impl(std::move(opts))) {
  impl_->own_cfg = std::make_unique<caf::actor_system_config>();
  auto threads = impl_->opts.scheduler_threads > 0
                   ? impl_->opts.scheduler_threads
                   : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  impl_->own_cfg->set("scheduler.max-threads", static_cast<size_t>(threads));
  // The work-sharing scheduler sleeps on a condition variable when idle: an
  // idle backend costs next to no CPU (the default work-stealing workers poll
  // every few microseconds, ~1 % of a core for 8 devices here), and its
  // remote hops are faster (NOTES.md). The local hot path does not go through
  // CAF's scheduler at all.
  impl_->own_cfg->set("scheduler.policy", caf::atom("sharing"));
  register_types(*impl_->own_cfg);
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
}

backend::backend(caf::actor_system& sys, backend_options opts)
  : impl_(make_impl(std::move(opts))) {
  impl_->sys = &sys;
}

backend::~backend() {
  impl_->shutdown();
  impl_->devices.clear();
  impl_->made.clear();
  if (impl_->own_sys) {
    impl_->own_sys->await_all_actors_done();
    impl_->own_sys.reset();
  }
}

const std::string& backend::name() const {
  return impl_->drv->backend_name();
}

caf::actor_system& backend::system() const {
  return *impl_->sys;
}

// Host pool calls go to the device's state directly, as schedule_task does:
// no CAF round trip (~70 us). Actors keep the messages.

void backend::alloc_pool(const device& d, int pool_id, std::size_t size_in_bytes,
                         std::size_t alignment, std::optional<memory_mode> mode) {
  impl_->core_of(d).alloc_pool(pool_id, size_in_bytes, alignment, mode);
}

void backend::free_pool(const device& d, int pool_id) {
  impl_->core_of(d).free_pool(pool_id);
}

void backend::memset_zero(const device& d, int pool_id, std::size_t offset,
                          std::size_t size_in_bytes) {
  impl_->core_of(d).memset_zero(pool_id, offset, size_in_bytes);
}

void backend::flush(const device& d) const {
  impl_->ask<uint64_t>(d, atoms::all_work_atom::value);
}

device backend::make_device(const multidev::dev& dv, const runner& r, int ordinal) {
  if (!r.core())
    throw std::invalid_argument("make_device: empty runner");
  {
    // A runner lives and dies with the backend that made it: a device
    // record here on another backend's runner would stop working when that
    // backend goes.
    std::lock_guard guard{impl_->mu};
    if (!impl_->actor_of.contains(r.core().get()))
      throw std::invalid_argument(fmt::format(
        "make_device: the runner of {} belongs to another backend; a device can "
        "only be made on a runner of this backend ({})",
        r.core()->name(), name()));
  }
  auto rec = std::make_shared<detail::device_record>();
  rec->dv = dv;
  rec->ordinal = ordinal;
  rec->device_id = detail::next_device_id.fetch_add(1);
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
  if (impl_->devices.empty()) {
    impl_->devices.resize(static_cast<std::size_t>(n));
  }
  auto& slot = impl_->devices[static_cast<std::size_t>(ordinal)];
  if (slot)
    return slot;
  auto rec = std::make_shared<detail::device_record>();
  rec->dv = multidev::dev{impl_->opts.driver, ordinal};
  rec->ordinal = ordinal;
  rec->device_id = detail::next_device_id.fetch_add(1);
  rec->name = fmt::format("{}:{}:{}", name(), ordinal, rec->device_id);
  auto core = std::make_shared<detail::device_core>(
    rec->name, ordinal, impl_->drv, impl_->opts.queue_capacity, impl_->results);
  rec->r = runner{core};
  slot = device{rec};
  impl_->made.push_back(slot);
  detail::logger_tie_guard untie; // spawning ties this thread to the system
  auto a = detail::spawn_device_actor(*impl_->sys, core);
  impl_->actor_of.emplace(core.get(), a);
  return slot;
}

int backend::num_devices() const {
  return impl_->drv->device_count();
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
  e.sync();
}

bool backend::is_done(const event& e) const {
  return e.is_done();
}

void backend::will_wait_for(const context& ctx, const event& e) {
  if (!e.core())
    return;
  record_of(ctx.device).r.core()->push_wait(e.core(), e.seq());
}

sexp backend::static_properties() const {
  return impl_->drv->properties();
}

multidev::hardware_limits backend::hardware_limits() const {
  return impl_->drv->limits();
}

std::size_t backend::get_used_memory(const device& d) const {
  return record_of(d).core().used_memory();
}

sexp backend::get_global_debug_info() const {
  auto devs = sexp::list({sexp::atom("devices")});
  std::vector<device> all;
  {
    std::lock_guard guard{impl_->mu};
    all = impl_->made;
  }
  for (const auto& d : all)
    devs.push_back(get_debug_info(d));
  return sexp::list({sexp::atom(name()),
                     sexp::field("num_devices", std::to_string(num_devices())),
                     sexp::field("devices_in_use", std::to_string(all.size())), devs});
}

sexp backend::get_debug_info(const device& d) const {
  auto info = record_of(d).core().debug_info();
  info.push_back(sexp::field("device_id", std::to_string(d.device_id())));
  return info;
}

void backend::await(const device& d) const {
  auto& core = record_of(d).core();
  core.sync(core.scheduled());
}

event backend::all_work(const device& d) const {
  auto& rec = record_of(d);
  return event{rec.r.core(), rec.r.core()->scheduled()};
}

bool backend::is_idle(const device& d) const {
  return record_of(d).core().is_idle();
}

void backend::schedule_task(const device& d, task t) {
  record_of(d).core().push(std::move(t));
}

event backend::schedule_named(const device& d, const task_spec& spec) {
  auto& core = record_of(d).r.core();
  auto seq = core->push(detail::bind_spec(core, spec).work);
  return event{core, seq};
}

std::optional<kernel_result> backend::result(const std::string& name) const {
  return impl_->results->get(name);
}

device_actor device_actor_of(const backend& b, const device& d) {
  return b.impl().actor_for(d);
}

} // namespace multidev
