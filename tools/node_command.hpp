#pragma once
// `multidev node`: serves this process's CPU devices to other processes.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace caf {
class actor_system;
} // namespace caf

namespace multidev::tools {

struct node_command_options {
  std::string bind = "127.0.0.1";
  uint16_t port = 0;
  int cpu_devices = 1;
  /// Empty: "<bind>:<port>".
  std::string name;
  /// Stop (as on SIGTERM) once nobody reads stdout any more: the process
  /// that started this node through a pipe is gone.
  bool stop_with_parent = false;
  /// The cookie clients must present to open a session (empty: the default
  /// file, `multidev::default_cookie_file()`).
  std::string cookie_file;
  /// What each session's pools may hold, in bytes (0: half the physical
  /// memory).
  std::size_t memory_limit = 0;
  /// How long a connection may stay open without a session, and how many
  /// such connections the node holds (`multidev::node_transport_limits`).
  std::chrono::milliseconds handshake_timeout{10'000};
  std::size_t max_unauthenticated = 64;
};

/// Publishes a node actor listing `cpu_devices` CPU devices on `sys` (which
/// has the middleman loaded), prints `listening on ADDR:PORT`, and serves
/// until SIGINT or SIGTERM, which the caller blocked before `sys` started
/// its threads. Returns the exit status.
int serve_node(caf::actor_system& sys, const node_command_options& opts);

} // namespace multidev::tools
