#pragma once
// What the tests that start `multidev node` processes share (test_nodes,
// test_rounds_nodes): the tool's path (the test's first argument), an actor
// system that can reach nodes with a backend of one local device on it, and
// two one-device nodes attached to such a backend. Each node process is
// reaped by `node_process` (scenario/node_process.hpp).
#include <boost/test/unit_test.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "scenario/node_process.hpp"
#include "test_support.hpp"

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace test_support {

/// The multidev tool: the test's argument.
inline std::string tool() {
  auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_TEST_REQUIRE(suite.argc >= 2, "the test needs the multidev tool's path as argument");
  return suite.argv[1];
}

/// An actor system that can reach nodes, and a backend of one local device
/// on it.
struct cluster {
  cluster() : sys(make_cfg()), b(sys, {.num_devices = 1}) {
  }

  static caf::actor_system_config& make_cfg() {
    static caf::actor_system_config* cfg = [] {
      auto c = new caf::actor_system_config;
      c->load<caf::io::middleman>();
      multidev::register_types(*c);
      c->set("scheduler.max-threads", std::size_t{2});
      // A silent peer is found by heartbeat: one every 500 ms, and a
      // connection quiet for 3 s is dropped.
      c->set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds{500}});
      c->set("middleman.connection-timeout", caf::timespan{std::chrono::seconds{3}});
      return c;
    }();
    return *cfg;
  }

  caf::actor_system sys;
  multidev::backend b;
};

/// Nodes "a" and "b" of one device each (`a0`, `b0`), attached to the
/// backend `b` of a cluster whose own device 0 is local. `na` is a pointer so
/// that a test can kill node a.
struct two_nodes {
  std::unique_ptr<multidev::scenario::node_process> na =
    std::make_unique<multidev::scenario::node_process>(tool(), 1, "a", true);
  multidev::scenario::node_process nb{tool(), 1, "b", true};
  cluster c;
  multidev::backend& b = c.b;
  multidev::device a0 =
    multidev::attach_node(b, "127.0.0.1", na->port(), test_attach_options()).at(0);
  multidev::device b0 =
    multidev::attach_node(b, "127.0.0.1", nb.port(), test_attach_options()).at(0);
};

} // namespace test_support
