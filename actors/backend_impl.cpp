// The state behind `backend`: which devices and actors it owns, the devices
// it attached, and shutdown.
#include "actors/backend_impl.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/thread_hook.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include <fmt/format.h>

#include <functional>
#include <stdexcept>

#include "actors/remote/endpoint_remote.hpp"
#include "actors/remote/node_rounds.hpp"
#include "actors/logger_tie.hpp"
#include "actors/reaper.hpp"

namespace multidev::detail {

device_record& record_of(const device& d) {
  if (!d.record())
    throw std::invalid_argument("empty device handle (default-constructed device)");
  return *d.record();
}

void refuse_remote(const device_record& rec, std::string_view what, std::string_view instead) {
  throw std::invalid_argument(fmt::format(
    "{}: {} is a device of another process (node {}), reached only by messages to its "
    "actor; {}",
    what, rec.name, rec.r.key().node.str(), instead));
}

device_core& device_record::core() const {
  return local_core(*this, "this call", "it needs a device of this process");
}

endpoint& backend_impl::endpoint_of(const device& d) const {
  auto& rec = record_of(d);
  std::lock_guard guard{mu};
  if (auto* c = rec.r.local_core()) {
    if (actor_of.contains(c))
      return rec.ep();
  } else if (auto i = attached.find(rec.r.key());
             i != attached.end() && i->second.get_runner() == rec.r) {
    return rec.ep();
  }
  throw std::invalid_argument(
    fmt::format("device {} does not belong to this backend", rec.name));
}

device_actor backend_impl::actor_for(const device& d) const {
  auto& ep = endpoint_of(d);
  if (ep.core()) {
    std::lock_guard guard{mu};
    auto i = actor_of.find(ep.core().get());
    if (i != actor_of.end())
      return i->second;
    throw std::invalid_argument(
      fmt::format("device {} does not belong to this backend", record_of(d).name));
  }
  return ep.actor();
}

device backend_impl::attach(const device_actor& a, const std::string& prefix, bool* fresh,
                            bool session, std::optional<std::chrono::nanoseconds> timeout) {
  if (fresh)
    *fresh = false;
  if (!a)
    throw std::invalid_argument("attach_device: invalid device actor handle");
  {
    // One of ours: the device itself.
    std::lock_guard guard{mu};
    for (auto& [core, own] : actor_of)
      if (own == a)
        for (auto& d : made)
          if (d.get_runner().local_core() == core)
            return d;
  }
  auto remote = attach_remote(*sys, a, prefix, opts.trace_capacity, session, timeout);
  std::lock_guard guard{mu};
  auto key = remote.ep->key();
  if (auto i = attached.find(key); i != attached.end()) {
    // Attached before (or by another thread meanwhile): keep the first.
    caf::anon_send_exit(remote.link, caf::exit_reason::user_shutdown);
    return i->second;
  }
  auto rec = std::make_shared<device_record>();
  rec->dv = multidev::dev{remote.driver, remote.ordinal};
  rec->ordinal = remote.ordinal;
  rec->device_id = static_cast<int>(key.device_id);
  rec->name = remote.ep->name();
  rec->r = runner{remote.ep};
  device d{std::move(rec)};
  attached.emplace(key, d);
  links.emplace(key, std::move(remote.link));
  if (fresh)
    *fresh = true;
  return d;
}

void backend_impl::detach(const device& d) {
  caf::actor link;
  {
    std::lock_guard guard{mu};
    auto key = record_of(d).r.key();
    auto i = attached.find(key);
    if (i == attached.end() || i->second.get_runner() != d.get_runner())
      return;
    attached.erase(i);
    if (auto l = links.find(key); l != links.end()) {
      link = std::move(l->second);
      links.erase(l);
    }
  }
  if (link)
    caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
}

void backend_impl::stop_accepting() {
  // The trace file's records of attached devices: their links close below.
  read_remote_traces();
  std::vector<std::shared_ptr<device_core>> all;
  std::map<device_key, caf::actor> remote_links;
  std::vector<caf::actor> keepers;
  {
    std::lock_guard guard{mu};
    for (auto& d : made)
      if (d.get_runner().local_core())
        all.push_back(d.get_runner().core());
    remote_links = std::move(links);
    links.clear();
    for (auto& n : nodes) // sessions' keepers: they detach on exit
      if (n.keeper)
        keepers.push_back(std::move(n.keeper));
  }
  for (auto& k : keepers)
    caf::anon_send_exit(k, caf::exit_reason::user_shutdown);
  // Every core stops accepting before any is joined: a runner finishing its
  // queue may be waiting on another device.
  if (opts.on_destroy == backend_options::destroy_policy::cancel)
    for (auto& c : all)
      c->life().cancel("cancelled: the backend was destroyed");
  for (auto& c : all)
    c->life().request_stop();
  for (auto& c : all) // every device stops: cut what leaves the backend
    c->life().cancel_unanswerable_waits();
  // The attached devices' links go too: calls still waiting on them (a task
  // syncing on a remote event, a host thread) fail instead of holding the
  // joins that follow.
  for (auto& [key, l] : remote_links)
    caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
}

void backend_impl::shutdown() {
  // Finish accepted work first (waits between devices resolve through the
  // cores), then stop the actors.
  stop_accepting();
  // The cores of this process; records made on an attached device's runner
  // have none (that device belongs to its own backend, elsewhere).
  std::vector<std::shared_ptr<device_core>> all;
  std::vector<device_actor> handles;
  std::vector<caf::actor_addr> nodes_served;
  {
    std::lock_guard guard{mu};
    for (auto& d : made)
      if (d.get_runner().local_core())
        all.push_back(d.get_runner().core());
    for (auto& [core, a] : actor_of)
      handles.push_back(a);
    actor_of.clear();
    nodes_served = std::move(node_actors);
    node_actors.clear();
  }
  for (auto& c : all)
    c->shutdown();
  std::shared_ptr<detail::host_rounds> rounds;
  {
    std::lock_guard guard{mu};
    rounds = here_rounds;
  }
  if (rounds)
    rounds->close(); // their waits on nodes were cancelled with the devices
  for (auto& a : handles)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  handles.clear();
  // The node actors that served these devices go with them.
  for (auto& n : nodes_served)
    if (auto a = caf::actor_cast<caf::actor>(n))
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

namespace {

/// The actor system whose thread this is, if any (`mark_system_threads`).
thread_local const caf::actor_system* system_of_this_thread = nullptr;

class system_thread_marker final : public caf::thread_hook {
public:
  void init(caf::actor_system& sys) override { sys_ = &sys; }
  void thread_started() override { system_of_this_thread = sys_; }
  void thread_terminates() override { system_of_this_thread = nullptr; }

private:
  const caf::actor_system* sys_ = nullptr;
};

/// The teardown proper, on a thread it does not wait for.
void tear_down(backend_impl& impl) {
  impl.shutdown();
  impl.write_trace_file(); // the devices are stopped, their records complete
  impl.devices.clear();
  impl.made.clear();
  if (impl.own_sys) {
    impl.own_sys->await_all_actors_done();
    impl.own_sys.reset();
  }
}

/// Keeps a system the program owns from finishing its destructor while a
/// teardown handed to the reaper still uses it: ~actor_system waits for
/// every actor, this one included, until the teardown stops it.
caf::behavior keeper_impl(caf::event_based_actor*, int) {
  return {[](int) {}};
}

} // namespace

void mark_system_threads(caf::actor_system_config& cfg) {
  cfg.add_thread_hook<system_thread_marker>();
}

bool backend_impl::teardown_waits_for_this_thread() const {
  if (own_sys && system_of_this_thread == own_sys.get())
    return true; // it waits for every actor and joins the workers
  if (home_runner == nullptr && current_runner == nullptr)
    return false;
  std::lock_guard guard{mu};
  for (auto& [core, a] : actor_of)
    if (core == home_runner || core == current_runner)
      return true; // it joins the runners
  return false;
}

void destroy(std::unique_ptr<backend_impl> impl) noexcept {
  if (!impl)
    return;
  try {
    if (!impl->teardown_waits_for_this_thread()) {
      tear_down(*impl);
      return; // the rest goes with `impl`
    }
    // This thread runs on once it returns: hand the teardown over. The
    // devices stop accepting work now, as they would here.
    impl->stop_accepting();
    caf::actor keeper;
    if (!impl->own_sys) {
      try {
        logger_tie_guard untie; // spawning ties this thread to the system
        // With an argument: CAF 0.17 dereferences a null argument tuple for
        // a function that takes none (UBSan).
        keeper = impl->sys->spawn(keeper_impl, 0);
      } catch (...) {
        // Out of memory: the program's system may then go first.
      }
    }
    std::function<void()> job = [impl = std::shared_ptr<backend_impl>(std::move(impl)),
                                 keeper]() mutable {
      tear_down(*impl);
      impl.reset(); // the devices, endpoints and driver, here too
      if (keeper)
        caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
    };
    if (!reaper::instance().adopt(job)) {
      // No thread to be had: the backend stays as it is (stopped, not torn
      // down) rather than hang this thread.
      new std::function<void()>(std::move(job));
    }
  } catch (...) {
    // Nothing in a teardown throws but an allocation; what is left is
    // destroyed with `impl`.
  }
}

} // namespace multidev::detail
