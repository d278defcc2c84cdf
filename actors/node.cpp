// Nodes: one actor per process lists its devices to other processes
// (spawn_node_actor), and a backend attaches all the devices of a node at
// once (attach_node), after its own in ordinal order.
#include "actors/backend_impl.hpp"
#include "actors/endpoint_remote.hpp"
#include "actors/logger_tie.hpp"
#include "actors/tls_middleman.hpp"

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <fmt/format.h>

#include <fstream>

#include <multidev/protocol.hpp>

namespace multidev {

namespace {

/// The node actor: answers `list` with its name and devices.
node_actor::behavior_type node_impl(node_actor::pointer, std::string name,
                                    std::vector<caf::actor> devices) {
  return {
    [name = std::move(name), devices = std::move(devices)](
      atoms::list_atom) -> caf::result<std::string, std::vector<caf::actor>> {
      return {name, devices};
    },
  };
}

} // namespace

node_actor spawn_node_actor(backend& b, std::string name) {
  std::vector<caf::actor> devices;
  for (int i = 0; i < b.num_devices(); ++i) {
    auto d = b.get_device(i);
    if (!d.is_local())
      continue; // a node serves its own devices, not the ones it attached
    devices.push_back(caf::actor_cast<caf::actor>(device_actor_of(b, d)));
  }
  node_actor node;
  {
    detail::logger_tie_guard untie; // spawning ties this thread to the system
    // Spawned from a function with arguments: CAF 0.17 dereferences a null
    // argument tuple for a function (or lambda) that takes none (UBSan).
    node = b.system().spawn(node_impl, std::move(name), std::move(devices));
  }
  // It serves the backend's devices: it goes with them (~backend stops it).
  auto& impl = b.impl();
  std::lock_guard guard{impl.mu};
  impl.node_actors.push_back(node.address());
  return node;
}

caf::expected<uint16_t> publish_node(const node_actor& node, uint16_t port,
                                     const std::string& address) {
  if (!node)
    return caf::sec::cannot_publish_invalid_actor;
  auto& sys = node.home_system();
  if (sys.has_openssl_manager()) {
    detail::use_clean_tls(sys); // one peer's loss must not close the others
    return caf::openssl::publish(node, port, address.c_str(), true);
  }
  return sys.middleman().publish(node, port, address.c_str(), true);
}

void configure_tls(caf::actor_system_config& cfg, const tls_files& files) {
  auto readable = [](const std::string& what, const std::string& path) {
    if (path.empty())
      throw std::invalid_argument(fmt::format("TLS: no {} file given", what));
    if (!std::ifstream{path})
      throw std::invalid_argument(fmt::format("TLS: cannot read the {} file '{}'", what, path));
  };
  readable("certificate", files.certificate);
  readable("private key", files.key);
  readable("CA certificate", files.ca_file);
  cfg.openssl_certificate = files.certificate;
  cfg.openssl_key = files.key;
  cfg.openssl_cafile = files.ca_file;
  cfg.openssl_passphrase = files.passphrase;
  cfg.load<caf::openssl::manager>();
}

std::vector<device> attach_node(backend& b, const std::string& host, uint16_t port,
                                std::chrono::milliseconds timeout) {
  auto& sys = b.system();
  auto address = fmt::format("{}:{}", host, port);
  if (!sys.has_middleman())
    throw std::invalid_argument(fmt::format(
      "attach_node {}: the backend's actor system has no middleman (call "
      "multidev::configure_system on its config)",
      address));
  if (caf::get_or(sys.config(), "middleman.heartbeat-interval", caf::timespan{0})
      <= caf::timespan{0})
    throw std::invalid_argument(fmt::format(
      "attach_node {}: the backend's actor system sends no heartbeats "
      "(middleman.heartbeat-interval is 0), so a node behind a cut link would hang every "
      "wait on it; set middleman.heartbeat-interval and middleman.connection-timeout, or call "
      "multidev::configure_system on its config",
      address));
  bool tls = sys.has_openssl_manager();
  if (tls)
    detail::use_clean_tls(sys); // one node's loss must not close the others
  auto node = tls ? caf::openssl::remote_actor<node_actor>(sys, host, port)
                  : sys.middleman().remote_actor<node_actor>(host, port);
  if (!node) {
    auto why = sys.render(node.error());
    if (node.error() == caf::sec::disconnect_during_handshake)
      why += tls ? " (does the node use TLS, and did the same CA sign both certificates?)"
                 : " (does the node use TLS? then this side needs it too)";
    throw device_error(address, fmt::format("attach_node: cannot reach a node at {}{}: {}", address,
                                            tls ? " over TLS" : "", why));
  }
  std::string name;
  std::vector<caf::actor> actors;
  {
    caf::scoped_actor self{sys};
    std::optional<caf::error> err;
    self->request(*node, timeout, atoms::list_atom::value)
      .receive([&](std::string& n, std::vector<caf::actor>& as) { name = std::move(n), actors = std::move(as); },
               [&](caf::error& e) { err = std::move(e); });
    if (err)
      throw device_error(address, fmt::format("attach_node: the node at {} did not list its "
                                              "devices: {}",
                                              address, sys.render(*err)));
  }
  // All or none: nothing is attached when the count is wrong, and what this
  // call attached is undone when a later step throws.
  auto& impl = b.impl();
  auto previous = [&]() -> std::vector<detail::backend_impl::attached_node>::iterator {
    auto it = std::find_if(impl.nodes.begin(), impl.nodes.end(),
                           [&](const auto& n) { return n.name == name; });
    if (it != impl.nodes.end() && it->devices.size() != actors.size())
      throw std::invalid_argument(fmt::format(
        "attach_node {}: node '{}' was attached before with {} device(s), it has {} now",
        address, name, it->devices.size(), actors.size()));
    return it;
  };
  {
    std::lock_guard guard{impl.mu};
    previous();
  }
  std::vector<device> result;
  std::vector<device> fresh;
  try {
    for (auto& a : actors) {
      bool is_new = false;
      result.push_back(impl.attach(caf::actor_cast<device_actor>(a), name + "/", &is_new));
      // Its devices' peers on other nodes connect to it there (direct paths).
      detail::set_node_address(impl.endpoint_of(result.back()), host, port);
      if (is_new)
        fresh.push_back(result.back());
    }
    std::lock_guard guard{impl.mu};
    auto it = previous(); // again: another thread may have attached it meanwhile
    auto local = impl.drv->device_count();
    // A node attached before under this name (restarted): its ordinals again.
    int first = it != impl.nodes.end() && !it->devices.empty()
                  ? it->devices.front().ordinal()
                  : local + static_cast<int>(impl.node_devices.size());
    for (std::size_t i = 0; i < result.size(); ++i) {
      // The record is this backend's view of the device: its ordinal here.
      auto& rec = *result[i].record();
      rec.ordinal = first + static_cast<int>(i);
      auto slot = static_cast<std::size_t>(rec.ordinal - local);
      if (slot < impl.node_devices.size())
        impl.node_devices[slot] = result[i];
      else
        impl.node_devices.push_back(result[i]);
    }
    if (it != impl.nodes.end()) {
      it->address = address;
      it->devices = result;
    } else {
      impl.nodes.push_back({name, address, result});
    }
  } catch (...) {
    for (auto& d : fresh)
      impl.detach(d);
    throw;
  }
  return result;
}

} // namespace multidev
