#include "node_command.hpp"

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/send.hpp>

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>
#include <thread>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

namespace multidev::tools {

int serve_node(caf::actor_system& sys, const node_command_options& opts) {
  auto name = opts.name.empty() ? "node-" + std::to_string(getpid()) : opts.name;
  int status = 0;
  {
    // Work accepted and not started when the node stops is cancelled, so the
    // peers waiting on it get an error naming the node instead of a hang.
    // Each runner keeps a trace of its last 65,536 items (`trace` message),
    // so the runs that attach the node can draw its devices. Runners are not
    // pinned: nodes often share a machine (a multi-node run on one host),
    // and each process would pin its first runner to the same first CPU.
    backend b{sys, {.num_devices = opts.cpu_devices,
                    .on_destroy = backend_options::destroy_policy::cancel,
                    .trace_capacity = std::size_t{1} << 16,
                    .pin_runners = false}};
    node_actor node;
    try {
      node = spawn_node_actor(b, name, opts.cookie_file, opts.memory_limit);
    } catch (const std::invalid_argument& e) {
      std::cerr << "multidev node: " << e.what() << "\n";
      return 2;
    }
    node_transport_limits limits;
    limits.handshake_timeout = opts.handshake_timeout;
    limits.max_unauthenticated = opts.max_unauthenticated;
    auto port = publish_node(node, opts.port, opts.bind, limits);
    if (!port) {
      std::cerr << "multidev node: cannot listen on " << opts.bind << ":" << opts.port << ": "
                << sys.render(port.error()) << "\n";
      caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
      return 1;
    }
    std::cout << "listening on " << opts.bind << ":" << *port << std::endl;
    if (opts.stop_with_parent)
      std::thread([] {
        // A pipe's write end polls as an error once its reader is gone.
        pollfd p{STDOUT_FILENO, 0, 0};
        while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
        }
        ::kill(::getpid(), SIGTERM);
      }).detach();
    std::cerr << "multidev node " << name << ": " << opts.cpu_devices
              << " CPU device(s), at most "
              << (opts.memory_limit ? opts.memory_limit : default_session_memory_limit())
              << " bytes of pools per session; SIGINT or SIGTERM stops it\n";
    // The signals were blocked before the actor system started its threads,
    // so they wait here for sigwait.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    std::cerr << "multidev node " << name << ": " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
              << ": stopping; work not started is cancelled\n";
    sys.middleman().unpublish(node, *port);
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  } // ~backend: cancels queued work, joins the runners, stops the device actors
  return status;
}

} // namespace multidev::tools
