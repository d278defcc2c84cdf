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
#include "actors/logger_tie.hpp"
#include "devices/registry.hpp"
#include "multidev/protocol.hpp"

namespace multidev {

using detail::record_of;

namespace {
std::atomic<int> next_device_id{1};
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
  impl_->flush(d);
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
  if (impl_->devices.empty()) {
    impl_->devices.resize(static_cast<std::size_t>(n));
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
    impl_->opts.max_in_flight);
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

event_state backend::state(const event& e) const {
  if (!e.core())
    return event_state::done;
  return e.core()->state(e.seq());
}

void backend::cancel(const device& d) {
  record_of(d).core().cancel("cancelled by cancel(device)");
}

bool backend::recover(const device& d) {
  return record_of(d).core().recover();
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
