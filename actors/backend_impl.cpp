// The state behind `backend`: which devices and actors it owns, the devices
// it attached, and shutdown.
#include "actors/backend_impl.hpp"

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include <fmt/format.h>

#include <stdexcept>

#include "actors/endpoint_remote.hpp"

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

device backend_impl::attach(const device_actor& a, const std::string& prefix, bool* fresh) {
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
  auto remote = attach_remote(*sys, a, prefix);
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

void backend_impl::shutdown() {
  // The cores of this process; records made on an attached device's runner
  // have none (that device belongs to its own backend, elsewhere).
  std::vector<std::shared_ptr<device_core>> all;
  std::vector<device_actor> handles;
  std::map<device_key, caf::actor> remote_links;
  {
    std::lock_guard guard{mu};
    for (auto& d : made)
      if (d.get_runner().local_core())
        all.push_back(d.get_runner().core());
    for (auto& [core, a] : actor_of)
      handles.push_back(a);
    actor_of.clear();
    remote_links = std::move(links);
    links.clear();
  }
  // Finish accepted work first (waits between devices resolve through the
  // cores), then stop the actors. Every core stops accepting before any is
  // joined: a runner finishing its queue may be waiting on another device.
  if (opts.on_destroy == backend_options::destroy_policy::cancel)
    for (auto& c : all)
      c->cancel("cancelled: the backend was destroyed");
  for (auto& c : all)
    c->request_stop();
  for (auto& c : all) // every device stops: cut what leaves the backend
    c->cancel_unanswerable_waits();
  // The attached devices' links go too: calls still waiting on them (a task
  // syncing on a remote event, a host thread) fail instead of holding the
  // joins below.
  for (auto& [key, l] : remote_links)
    caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
  remote_links.clear();
  for (auto& c : all)
    c->shutdown();
  for (auto& a : handles)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  handles.clear();
}

} // namespace multidev::detail
