// Nodes: `multidev node` processes serving their devices over CAF's
// middleman on 127.0.0.1, attached with attach_node: their devices take the
// ordinals after the local ones, named after the node; named tasks and waits
// cross both ways; `kill -9` of a node fails its pending work and the local
// work waiting on it with errors naming the node; a restarted node attaches
// again under the same ordinals; SIGTERM stops a node cleanly. A failure
// that crosses nodes keeps its provenance, every device named as this
// process names it, also when its origin's node was killed.
//
// The tool's path is the test's first argument. Every node process is
// reaped (scenario/node_process.hpp, which `multidev run --spawn-nodes` uses).
#define BOOST_TEST_MODULE nodes
#include <boost/test/unit_test.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/data/monomorphic.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "actors/core/device_core.hpp"
#include "actors/remote/endpoint_remote.hpp"
#include "actors/remote/reply_sink.hpp"
#include "actors/remote/tls_middleman.hpp"
#include "node_support.hpp"
#include "scenario/node_process.hpp"
#include "scenario/scenario.hpp"
#include "test_certs.hpp"
#include "test_support.hpp"


#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <future>
#include <limits>
#include <optional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

using namespace std::chrono_literals;
using namespace multidev;
using test_support::contains;

namespace {

using multidev::scenario::node_process;
namespace scenario = multidev::scenario;

using test_support::cluster;
using test_support::tool;
using test_support::two_nodes;

buffer_arg buffer(int pool, std::size_t bytes) {
  return buffer_arg{buffer_loc{pool, 0}, bytes};
}

/// The one device of `node`, attached to `b`; the test stops unless the
/// node has exactly one.
device attach_one(backend& b, const node_process& node) {
  auto ds = attach_node(b, "127.0.0.1", node.port());
  BOOST_TEST_REQUIRE(ds.size() == 1u);
  return ds[0];
}

/// A node "b" of one device `d`, attached to `b`, for batches of
/// `y += 1 * x`: pool 1000 on it holds y (offset 0) and x = 1 (offset 4);
/// y is set to 0 by `y_zeroed`, not waited for.
struct axpy_on_a_node {
  axpy_on_a_node() {
    d = attach_one(b, node);
    b.alloc_pool(d, 1000, 8, 64);
    b.schedule_named(d, {"fill", {buffer(1000, 8), 1.0}});
    y_zeroed = b.schedule_named(d, {"fill", {y, 0.0}});
  }

  node_process node{tool(), 1, "b", true};
  cluster c;
  backend& b = c.b;
  device d;
  buffer_arg y{buffer_loc{1000, 0}, 4};
  buffer_arg x{buffer_loc{1000, 4}, 4};
  event y_zeroed;
};

/// A node actor that lists `devices` under `name`, whatever they are: the
/// seam for attach_node's failures (a device that does not answer, a node
/// whose device count changed).
node_actor::behavior_type listing_impl(node_actor::pointer, std::string name,
                                       std::vector<caf::actor> devices) {
  return {
    // No sessions (session 0): its devices as they are, shared; any cookie.
    [name, devices](atoms::open_atom, const std::string&, int64_t, const std::string&)
      -> caf::result<std::string, std::string, uint64_t, int64_t, std::vector<caf::actor>> {
      return {name, "listing " + name, uint64_t{0}, int64_t{0}, devices};
    },
    [](atoms::trust_atom, uint64_t, const caf::node_id&) { return false; },
    [](atoms::renew_atom, uint64_t, uint64_t, uint64_t) -> int64_t { return 0; },
    [](atoms::detach_atom, uint64_t) { return false; },
    [](atoms::round_put_atom, uint64_t, const round_part&) { return false; },
    [](atoms::round_run_atom, uint64_t, uint64_t, uint64_t,
       const std::vector<wire_arg>&) -> caf::result<std::vector<uint64_t>> {
      return make_error(errc::invalid_argument, "", "no sessions: no rounds");
    },
    [](atoms::round_done_atom, uint64_t, const std::vector<round_notice>&) {},
    [](atoms::round_drop_atom, uint64_t, uint64_t) { return false; },
    [](atoms::round_refused_atom, uint64_t, uint64_t, uint64_t, const caf::actor&,
       const std::string&) { return false; },
    [](atoms::lost_atom, uint64_t, const caf::actor&, const std::string&) {},
    [](atoms::debug_atom) { return std::string{}; },
  };
}

/// An actor listed as a device that is none: it refuses `identify`.
caf::behavior not_a_device(caf::event_based_actor*, std::string why) {
  return {
    [why](atoms::identify_atom) -> caf::error {
      return make_error(errc::device_failed, "", why);
    },
  };
}

/// Two backends of this process, each with its own actor system: `server`
/// serves its devices through node actors the test makes (`serve`),
/// `client` attaches them with attach_node over 127.0.0.1.
struct in_process_nodes {
  explicit in_process_nodes(backend_options server_opts = {.num_devices = 3})
    : server(server_opts) {}
  in_process_nodes(const in_process_nodes&) = delete;
  in_process_nodes& operator=(const in_process_nodes&) = delete;
  ~in_process_nodes() {
    for (auto& a : actors) // a node actor left running would hold ~backend
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  /// Publishes a node actor named `name` listing `devices`; returns its port.
  uint16_t serve(const std::string& name, std::vector<caf::actor> devices) {
    auto n = server.system().spawn(listing_impl, name, std::move(devices));
    actors.push_back(caf::actor_cast<caf::actor>(n));
    auto port = publish_node(n, 0, "127.0.0.1");
    if (!port)
      BOOST_FAIL("publish_node: " << server.system().render(port.error()));
    return *port;
  }
  caf::actor device(int i) {
    return caf::actor_cast<caf::actor>(device_actor_of(server, server.get_device(i)));
  }
  caf::actor bogus(const std::string& why) {
    actors.push_back(server.system().spawn(not_a_device, why));
    return actors.back();
  }

  backend server;
  backend client{{.num_devices = 1}};
  std::vector<caf::actor> actors;
};

/// Shortens the timeout of the remote queries that change nothing
/// (`detail::set_query_timeout`) for one test.
struct query_timeout_guard {
  explicit query_timeout_guard(std::chrono::milliseconds t) { detail::set_query_timeout(t); }
  ~query_timeout_guard() { detail::set_query_timeout(std::chrono::minutes{5}); }
};

/// The bytes every TCP connection of this process has received so far (the
/// kernel's count, `tcpi_bytes_received`), summed over its open sockets: what
/// passes through this process on its way between two nodes shows here.
uint64_t tcp_bytes_received() {
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator{"/proc/self/fd"}) {
    int fd = 0;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (...) {
      continue;
    }
    tcp_info info{};
    socklen_t len = sizeof info;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0
        && len >= offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received)
      total += info.tcpi_bytes_received;
  }
  return total;
}

/// A task on `local` that waits until `release` (30 s at most, then it
/// throws): what waits on it waits as long.
std::shared_ptr<std::promise<void>> hold(backend& b, const device& local) {
  auto release = std::make_shared<std::promise<void>>();
  auto open = release->get_future().share();
  b.schedule_task(local, {"held", [open] {
                            if (open.wait_for(30s) != std::future_status::ready)
                              throw std::runtime_error("never released");
                          }});
  return release;
}

/// A node `t` of `bytes` on a0 (`ca`) and on b0 (`cb`), for copies a -> b.
struct a_node_on_each : two_nodes {
  explicit a_node_on_each(std::size_t bytes) : t{1, "t", bytes, memory_mode::on_device} {
  }
  tnode t;
  context ca = b.alloc_node(b.make_context(a0), t);
  context cb = b.alloc_node(b.make_context(b0), t);
};

/// Waits (`what`, bounded) for the copy `copied` to b0 to fail with an
/// error that names `expected` (`if_succeeded` is the error when it does
/// not fail); then b0 recovers and runs a task.
void expect_copy_fails_and_b0_recovers(a_node_on_each& n, const event& copied,
                                       const std::string& expected, const char* what,
                                       const char* if_succeeded) {
  try {
    test_support::bounded([&] { n.b.sync(copied); }, what);
    BOOST_ERROR(if_succeeded);
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), expected), e.what());
  }
  BOOST_TEST(n.b.recover(n.b0));
  n.b.sync(n.b.schedule_named(n.b0, {"spin_ns", {int64_t{0}}}));
}

using test_support::have_certificates;
using test_support::node_tls_args;
using test_support::test_certificates;

/// How a node is lost.
enum class loss { kill9, sigterm, sigstop };
std::ostream& operator<<(std::ostream& os, loss l) {
  return os << (l == loss::kill9 ? "kill -9" : l == loss::sigterm ? "SIGTERM" : "SIGSTOP");
}

} // namespace

BOOST_AUTO_TEST_CASE(test_nodes_devices_come_after_the_local_ones_and_work_crosses_both_ways) {
  node_process node{tool(), 2, "b", true};
  cluster c;
  auto& b = c.b;
  auto ds = attach_node(b, "127.0.0.1", node.port());
  BOOST_TEST_REQUIRE(ds.size() == 2u);
  BOOST_TEST(b.num_devices() == 3);
  BOOST_TEST((b.get_device(1) == ds[0]));
  BOOST_TEST((b.get_device(2) == ds[1]));
  BOOST_TEST(ds[0].ordinal() == 1);
  BOOST_TEST(ds[1].name().rfind("b/", 0) == 0, ds[1].name());
  auto props = b.static_properties().to_string();
  BOOST_TEST(contains(props, "(nodes (node (name b) (address 127.0.0.1:"), props);
  BOOST_TEST(contains(props, "(ordinal 2)"), props);
  // A named kernel on the node, its result read back.
  b.alloc_pool(ds[0], 1000, 4096, 64);
  b.schedule_named(ds[0], {"fill", {buffer(1000, 4096), 2.0}});
  auto sum = b.schedule_named(ds[0], {"checksum", {buffer(1000, 4096), std::string{"node_sum"}}});
  b.sync(sum);
  auto r = b.result(ds[0], "node_sum");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == 2048.0);
  // The local device waits for the node's device, and the node's other
  // device waits for the local one.
  auto local = b.get_device(0);
  auto spin = b.schedule_named(ds[0], {"spin_ns", {int64_t{2'000'000}}});
  b.will_wait_for(b.make_context(local), spin);
  std::atomic<bool> saw_done{false};
  b.schedule_task(local, {"after the node", [&] { saw_done = b.is_done(spin); }});
  auto local_done = b.all_work(local);
  b.will_wait_for(b.make_context(ds[1]), local_done);
  auto last = b.schedule_named(ds[1], {"spin_ns", {int64_t{0}}});
  b.sync(last);
  BOOST_TEST(saw_done.load());
  BOOST_TEST(b.is_done(local_done));
  // A closure cannot travel.
  try {
    b.schedule_task(ds[1], {"closure", [] {}});
    BOOST_ERROR("a closure was sent to a remote device");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "b/"), e.what());
  }
}

BOOST_FIXTURE_TEST_CASE(test_nodes_a_batch_of_named_tasks_runs_each_task_once_in_order, axpy_on_a_node) {
  // 10,000 `y += 1 * x` with x = 1 on a node's device, sent by schedule_batch
  // (three messages): y counts the tasks that ran, exactly (floats count
  // exactly up to 2^24). A batch with an unknown kernel in the middle
  // schedules none of it.
  constexpr int n = 10'000;
  std::vector<task_spec> specs(n, task_spec{"axpy", {y, 1.0, x}});
  auto events = b.schedule_batch(d, specs);
  BOOST_TEST_REQUIRE(events.size() == std::size_t{n});
  bool increasing = true;
  for (std::size_t i = 1; i < events.size(); ++i)
    increasing = increasing && events[i].seq() > events[i - 1].seq();
  BOOST_TEST(increasing);
  auto before = b.all_work(d);
  std::vector<task_spec> bad{{"axpy", {y, 1.0, x}}, {"no_such_kernel", {}}, {"axpy", {y, 1.0, x}}};
  try {
    b.schedule_batch(d, bad);
    BOOST_ERROR("a batch with an unknown kernel was scheduled");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "no_such_kernel"), e.what());
  }
  BOOST_TEST(b.all_work(d).seq() == before.seq());
  b.sync(b.schedule_named(d, {"checksum", {y, std::string{"batch_count"}}}));
  // Not waited on here: is_done learns it by asking, never waiting.
  BOOST_TEST(test_support::eventually([&] { return b.is_done(events.back()); }));
  auto r = b.result(d, "batch_count");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == static_cast<double>(n));
}

BOOST_AUTO_TEST_CASE(test_nodes_kill9_fails_pending_work_naming_the_node_and_a_restart_reattaches) {
  auto n1 = std::make_unique<node_process>(tool(), 1, "b", true);
  cluster c;
  auto& b = c.b;
  auto ds = attach_node(b, "127.0.0.1", n1->port());
  BOOST_TEST_REQUIRE(ds.size() == 1u);
  // Busy for 30 s, with work queued behind, and a local device waiting.
  b.schedule_named(ds[0], {"spin_ns", {int64_t{30'000'000'000}}});
  auto pending = b.schedule_named(ds[0], {"spin_ns", {int64_t{0}}});
  auto local = b.get_device(0);
  b.will_wait_for(b.make_context(local), pending);
  b.schedule_task(local, {"dependent", [] {}});
  auto dependent = b.all_work(local);
  n1->kill9();
  auto start = std::chrono::steady_clock::now();
  try {
    test_support::bounded([&] { b.sync(pending); }, "sync on the dead node");
    BOOST_ERROR("sync on the dead node's work returned");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "b/"), e.what());
  }
  try {
    test_support::bounded([&] { b.sync(dependent); }, "sync on the local dependent");
    BOOST_ERROR("the local dependent of the dead node's work succeeded");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "b/"), e.what());
    BOOST_TEST(e.device_name() == local.name());
  }
  BOOST_TEST((std::chrono::steady_clock::now() - start < 10s));
  // The local device recovers. Waiting on the dead node's work, or making
  // its device wait, is refused at the call.
  BOOST_TEST(b.recover(local));
  try {
    b.will_wait_for(b.make_context(local), pending);
    BOOST_ERROR("a wait on the dead node's work was accepted");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "b/"), e.what());
  }
  try {
    b.will_wait_for(b.make_context(ds[0]), b.all_work(local));
    BOOST_ERROR("the dead node's device was made to wait");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "b/"), e.what());
  }
  // The node comes back under the same name and its device takes the same
  // ordinal.
  node_process n2{tool(), 1, "b", true};
  auto again = attach_node(b, "127.0.0.1", n2.port());
  BOOST_TEST_REQUIRE(again.size() == 1u);
  BOOST_TEST(again[0].ordinal() == 1);
  BOOST_TEST((b.get_device(1) == again[0]));
  BOOST_TEST(b.num_devices() == 2);
  b.sync(b.schedule_named(again[0], {"spin_ns", {int64_t{0}}}));
}

BOOST_AUTO_TEST_CASE(test_nodes_transfers_move_the_bytes_exactly_in_every_direction) {
  // host -> node a, a/0 -> b/0 (between nodes), b/0 -> local, local -> b/1,
  // and into a/0's merge buffer, summed there by a named kernel.
  node_process a{tool(), 1, "a", true};
  node_process nb{tool(), 2, "b", true};
  cluster c;
  auto& b = c.b;
  auto on_a = attach_node(b, "127.0.0.1", a.port());
  auto on_b = attach_node(b, "127.0.0.1", nb.port());
  BOOST_TEST_REQUIRE(on_a.size() == 1u);
  BOOST_TEST_REQUIRE(on_b.size() == 2u);
  constexpr std::size_t n = 4096;
  tnode t{1, "t", n * sizeof(float), memory_mode::on_device};
  // Values that a lost, doubled or shifted byte would change.
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i)
    host[i] = static_cast<float>(i) * 1.25f + 0.5f;
  auto ca = b.init_from_host(b.make_context(on_a[0]), t, std::as_bytes(std::span{host}));
  auto cb = b.init_from_device(t, b.make_context(on_b[0]), ca);
  auto local = b.init_from_device(t, b.make_context(b.get_device(0)), cb);
  auto cb1 = b.init_from_device(t, b.make_context(on_b[1]), local);
  std::vector<float> back(n), back_b1(n);
  BOOST_TEST(b.to_host(local, t, std::as_writable_bytes(std::span{back})));
  b.sync(b.all_work(local.device));
  BOOST_TEST(std::memcmp(back.data(), host.data(), n * sizeof(float)) == 0);
  BOOST_TEST(b.to_host(cb1, t, std::as_writable_bytes(std::span{back_b1})));
  BOOST_TEST(std::memcmp(back_b1.data(), host.data(), n * sizeof(float)) == 0);
  // b/0's node into a/0's merge buffer, added to a/0's own copy there.
  auto copy = b.device_to_device(t, merge_buffer_use::copy, ca, cb);
  BOOST_TEST_REQUIRE(copy.has_value());
  auto buf = buffer_arg{ca.buffers.at(t), t.size_in_bytes};
  b.sync(b.schedule_named(on_a[0], {"add_from_merge", {buf, buf}}));
  std::vector<float> sum(n);
  BOOST_TEST(b.to_host(ca, t, std::as_writable_bytes(std::span{sum})));
  bool exact = true;
  for (std::size_t i = 0; i < n; ++i)
    exact = exact && sum[i] == host[i] + host[i];
  BOOST_TEST(exact);
  // A copy across processes is done by device_to_device itself: its routine
  // does not run again.
  BOOST_CHECK_THROW(b.run(*copy), std::invalid_argument);
  // A read of a size no pool holds (here: more bytes than memory) is
  // refused with an error; the node goes on.
  {
    caf::scoped_actor self{c.sys};
    bool refused = false;
    self->request(device_actor_of(b, on_a[0]), 30s, atoms::read_atom::value,
                  static_cast<int32_t>(ca.buffers.at(t).pool_id), uint64_t{0},
                  uint64_t{1} << 62)
      .receive([&](const std::string&) {}, [&](caf::error&) { refused = true; });
    BOOST_TEST(refused);
  }
  b.sync(b.schedule_named(on_a[0], {"spin_ns", {int64_t{0}}}));
}

BOOST_AUTO_TEST_CASE(test_nodes_a_silent_node_fails_its_work_by_heartbeat) {
  // SIGSTOP: the connection stays open but nothing comes from the node, as
  // behind a cut link. The heartbeat timeout (3 s here) drops it, and the
  // work on it and waiting for it fails naming it, within 10 s.
  node_process silent{tool(), 1, "s", true};
  cluster c;
  auto& b = c.b;
  auto remote = attach_one(b, silent);
  auto local = b.get_device(0);
  b.schedule_named(remote, {"spin_ns", {int64_t{20'000'000'000}}});
  auto pending = b.schedule_named(remote, {"spin_ns", {int64_t{0}}});
  b.will_wait_for(b.make_context(local), pending);
  b.schedule_task(local, {"dependent", [] {}});
  auto dependent = b.all_work(local);
  silent.pause();
  auto start = std::chrono::steady_clock::now();
  try {
    test_support::bounded([&] { b.sync(dependent); }, "sync behind the silent node");
    BOOST_ERROR("work waiting for a silent node succeeded");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "s/"), e.what());
  }
  auto took = std::chrono::steady_clock::now() - start;
  BOOST_TEST((took < 10s), std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                             << " ms");
  silent.kill9(); // its runner still spins: no need to wait for it
}

BOOST_AUTO_TEST_CASE(test_nodes_state_is_done_and_is_idle_on_a_silent_node_answer_at_once) {
  // Issue 37 point 6: state, is_done, is_failed and is_idle never block. On
  // a node fallen silent (SIGSTOP) they answer at once from what this
  // process knows (they blocked until the heartbeat dropped the node, then
  // threw); once it is lost, its unknown seqs are failed, still at once.
  node_process silent{tool(), 1, "s", true};
  cluster c;
  auto& b = c.b;
  auto d = attach_one(b, silent);
  auto done = b.schedule_named(d, {"spin_ns", {int64_t{0}}});
  b.sync(done);
  auto busy = b.schedule_named(d, {"spin_ns", {int64_t{20'000'000'000}}});
  auto queued = b.schedule_named(d, {"spin_ns", {int64_t{0}}});
  silent.pause();
  // Each answer well before the heartbeat drops the node (3 s): one that
  // waited on the silent node would take that long or longer.
  auto at_once = [](const char* what, auto f) {
    auto start = std::chrono::steady_clock::now();
    std::optional<decltype(f())> r;
    try {
      r = f();
    } catch (const std::exception& e) {
      BOOST_ERROR(what << " threw: " << e.what());
    }
    auto took = std::chrono::steady_clock::now() - start;
    BOOST_TEST((took < 2000ms),
               what << " took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                    << " ms");
    return r;
  };
  using multidev::event_state;
  BOOST_TEST((at_once("state(busy)", [&] { return b.state(busy); }) == event_state::pending));
  BOOST_TEST((at_once("state(queued)", [&] { return b.state(queued); }) == event_state::pending));
  BOOST_TEST((at_once("is_done(queued)", [&] { return b.is_done(queued); }) == false));
  BOOST_TEST((at_once("is_failed(queued)", [&] { return queued.is_failed(); }) == false));
  BOOST_TEST((at_once("is_idle", [&] { return b.is_idle(d); }) == false));
  BOOST_TEST((at_once("state(done)", [&] { return b.state(done); }) == event_state::done));
  // The heartbeat drops it (3 s); then its unknown seqs are failed.
  BOOST_CHECK_THROW(test_support::bounded([&] { b.sync(queued); }, "sync on the silent node"),
                    device_error);
  BOOST_TEST((at_once("state(busy), lost", [&] { return b.state(busy); }) == event_state::failed));
  BOOST_TEST((at_once("is_failed, lost", [&] { return queued.is_failed(); }) == true));
  BOOST_TEST((at_once("is_idle, lost", [&] { return b.is_idle(d); }) == false));
  BOOST_TEST((at_once("state(done), lost", [&] { return b.state(done); }) == event_state::done));
  silent.kill9(); // its runner still spins: no need to wait for it
}

BOOST_FIXTURE_TEST_CASE(test_nodes_diagnosis_follows_waits_into_other_nodes_and_names_a_silent_one, two_nodes) {
  // Issue 37 point 6: a deadline's chain follows the waits into the nodes
  // (it stopped at the process edge: "lives on another node and has not
  // reported it done"); get_global_debug_info lists each node device's part
  // of its node's wait-for graph, and a silent node as silent, within its
  // deadline (it blocked until the heartbeat dropped the node).
  auto local = b.get_device(0);
  auto busy = b.schedule_named(a0, {"spin_ns", {int64_t{20'000'000'000}}});
  b.will_wait_for(b.make_context(b0), busy);
  auto behind = b.schedule_named(b0, {"spin_ns", {int64_t{0}}});
  b.will_wait_for(b.make_context(local), behind);
  b.schedule_task(local, {"after b", [] {}});
  auto last = b.all_work(local);
  auto s = [](const event& e) { return std::to_string(e.seq()); };
  auto chain_of = [&](const event& e) -> std::string {
    try {
      b.sync(e, 50ms);
      BOOST_ERROR("a sync with a deadline returned before a's task ended");
    } catch (const multidev::timeout_error& x) {
      return x.chain();
    }
    return {};
  };
  auto from_b = b0.name() + " waits on event " + s(busy) + " of " + a0.name() + ", which ";
  // The task a0 runs, by its description (the node's trace keeps it).
  auto running = "is running '(spin_ns 20000000000)' (its seq " + s(busy) + ")";
  BOOST_TEST(chain_of(behind) == from_b + running);
  BOOST_TEST(chain_of(last) == local.name() + " waits on event " + s(behind) + " of " + b0.name()
                                 + ", which waits on event " + s(busy) + " of " + a0.name()
                                 + ", which " + running);
  // The nodes' wait-for graphs, in this process's names.
  auto global = b.get_global_debug_info();
  auto attached = global.find("attached");
  BOOST_TEST_REQUIRE(attached != nullptr);
  auto text = attached->to_string();
  BOOST_TEST(contains(text, "(wait (waiter " + b0.name() + ") (at_seq "), text);
  BOOST_TEST(contains(text, "(event (device " + a0.name() + ") (seq " + s(busy) + ")"), text);
  // a falls silent: listed as such within the deadline, and a chain names it.
  na->pause();
  auto start = std::chrono::steady_clock::now();
  auto info = test_support::bounded([&] { return b.get_global_debug_info(); }, "debug info");
  auto took = std::chrono::steady_clock::now() - start;
  BOOST_TEST((took < 2500ms), std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                                << " ms");
  text = info.find("attached")->to_string();
  BOOST_TEST(contains(text, "(device (name " + a0.name() + ") (silent \"silent for "), text);
  BOOST_TEST(contains(text, "(waiter " + b0.name() + ")"), text); // b still answers
  start = std::chrono::steady_clock::now();
  auto chain = chain_of(behind);
  took = std::chrono::steady_clock::now() - start;
  BOOST_TEST(contains(chain, from_b + "has not said why within"), chain);
  BOOST_TEST(contains(chain, "its node is silent"), chain);
  BOOST_TEST((took < 1s), std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                            << " ms");
  na->kill9();
  nb.kill9();
}

BOOST_AUTO_TEST_CASE(test_nodes_a_lost_node_is_drawn_from_its_last_reply_to_its_loss) {
  // Issue 39 point 3: with tracing on, the loss of a node is a host span of
  // its device, and a slice on its lane: from the device's last reply to
  // when the loss was declared. A node's session is declared lost once no
  // lease renewal was acknowledged for the lease and its margin (3 + 1 s by
  // default), whether the node fell silent or its connection closed at once
  // (killed): it may still be running the session's work until its lease
  // ends (issue 37 point 2).
  node_process silent{tool(), 1, "s", true};
  node_process killed{tool(), 1, "k", true};
  caf::actor_system sys{cluster::make_cfg()};
  backend b{sys, {.num_devices = 1, .trace_capacity = 64}};
  auto on_s = attach_node(b, "127.0.0.1", silent.port());
  auto on_k = attach_node(b, "127.0.0.1", killed.port());
  BOOST_TEST_REQUIRE(on_s.size() == 1u);
  BOOST_TEST_REQUIRE(on_k.size() == 1u);
  std::vector<event> pending;
  for (const auto& d : {on_s[0], on_k[0]}) {
    b.schedule_named(d, {"spin_ns", {int64_t{20'000'000'000}}});
    pending.push_back(b.schedule_named(d, {"spin_ns", {int64_t{0}}})); // the last reply
  }
  auto quiet = trace_clock_ns();
  silent.pause();
  killed.kill9();
  for (const auto& e : pending)
    BOOST_CHECK_THROW(test_support::bounded([&] { b.sync(e); }, "sync on a lost node"),
                      device_error);
  auto found = trace_clock_ns();
  auto loss_of = [&](const device& d) {
    auto t = b.trace(d);
    BOOST_TEST(t.records.empty());
    BOOST_TEST(contains(t.unreachable, "session ended"), t.unreachable);
    host_span loss;
    for (const auto& h : t.host)
      if (h.kind == host_span_kind::node_lost)
        loss = h;
    BOOST_TEST(contains(loss.description, "node lost: " + d.name()), to_sexp(t).to_string());
    BOOST_TEST(loss.failed);
    BOOST_TEST(loss.start_ns <= loss.end_ns);
    BOOST_TEST(loss.end_ns <= found);
    return loss;
  };
  auto s = loss_of(on_s[0]), k = loss_of(on_k[0]);
  // Both: declared no earlier than the lease and margin after the last
  // acknowledged renewal (at most a renewal interval before it fell quiet),
  // and drawn from no later than a heartbeat interval (and some delay)
  // after it fell quiet.
  for (const auto& l : {s, k}) {
    BOOST_TEST(l.end_ns - quiet >= 2'900'000'000, l.end_ns - quiet << " ns");
    BOOST_TEST(l.end_ns - quiet < 8'000'000'000, l.end_ns - quiet << " ns");
    BOOST_TEST(l.start_ns <= quiet + 1'000'000'000, l.start_ns - quiet << " ns after quiet");
  }
  // On the timeline, on each device's lane.
  auto tl = make_timeline(b);
  std::map<std::string, int> lost_on;
  for (const auto& sl : tl.slices)
    if (sl.kind == "lost")
      ++lost_on[tl.lanes[sl.lane]];
  BOOST_TEST((lost_on == std::map<std::string, int>{{"device 1 (" + on_s[0].name() + ")", 1},
                                                   {"device 2 (" + on_k[0].name() + ")", 1}}));
  BOOST_TEST(contains(timeline_svg(tl), "node lost: " + on_s[0].name()));
  silent.kill9(); // its runner still spins: no need to wait for it
}

BOOST_AUTO_TEST_CASE(test_nodes_a_node_keeps_serving_after_a_burst_of_bad_messages) {
  // Issue 38 point 4, across processes: a session's client sends its
  // device 1,000 messages with fields out of bounds (a memory mode, an
  // alignment, names and texts too long, too many arguments, a span past a
  // pool) and the node a few of its own; each gets a refusal naming the
  // field, and the node goes on serving the session and a new one.
  node_process node{tool(), 1, "b", true};
  cluster c;
  auto d = attach_one(c.b, node);
  auto act = device_actor_of(c.b, d);
  caf::scoped_actor self{c.sys};
  const std::string long_name(2000, 'x');
  int refused = 0;
  std::string last_error;
  auto expect_refusal = [&](auto&&... xs) {
    bool value = false;
    self->request(act, 10s, std::forward<decltype(xs)>(xs)...)
      .receive([&](uint64_t) { value = true; },
               [&](caf::error& e) {
                 ++refused;
                 last_error = c.sys.render(e);
               });
    return !value;
  };
  int accepted = 0;
  auto burst_start = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) {
    bool ok = true;
    switch (i % 5) {
      case 0:
        ok = expect_refusal(atoms::alloc_atom::value, int32_t{1}, uint64_t{64}, uint64_t{64},
                            int32_t{100 + i});
        break;
      case 1:
        ok = expect_refusal(atoms::alloc_atom::value, int32_t{1}, uint64_t{1}, uint64_t{1} << 40,
                            int32_t{-1});
        break;
      case 2:
        ok = expect_refusal(atoms::schedule_atom::value, task_spec{long_name, {}});
        break;
      case 3:
        ok = expect_refusal(
          atoms::schedule_atom::value,
          task_spec{"fill", std::vector<kernel_arg>(100, kernel_arg{int64_t{i}})});
        break;
      default:
        ok = expect_refusal(atoms::memset_atom::value, int32_t{7}, std::numeric_limits<uint64_t>::max(),
                            uint64_t{8});
        break;
    }
    if (!ok)
      ++accepted;
  }
  auto burst_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now()
                                                            - burst_start)
                    .count();
  BOOST_TEST_MESSAGE("1,000 bad messages refused one by one in " << burst_ms << " ms");
  BOOST_TEST(accepted == 0);
  BOOST_TEST(refused == 1000, "the last refusal: " << last_error);
  // The node actor itself: a client name too long, the invalid node vouched for.
  auto node_actor_handle = c.sys.middleman().remote_actor<node_actor>("127.0.0.1", node.port());
  BOOST_TEST_REQUIRE(bool(node_actor_handle),
                     (node_actor_handle ? std::string{} : c.sys.render(node_actor_handle.error())));
  std::string open_error;
  self->request(*node_actor_handle, 10s, atoms::open_atom::value, long_name, int64_t{1'000'000'000},
                load_cookie())
    .receive([&](std::string&, std::string&, uint64_t, int64_t, std::vector<caf::actor>&) {},
             [&](caf::error& e) { open_error = c.sys.render(e); });
  BOOST_TEST(contains(open_error, "open: client name of 2000 bytes exceeds"), open_error);
  // A stray error message, and an exit message (exit_reason::kill ends an
  // actor whatever its exit handler says): either stopped the node actor.
  self->send(caf::actor_cast<caf::actor>(*node_actor_handle),
             caf::make_error(caf::sec::unexpected_message));
  self->send_exit(*node_actor_handle, caf::exit_reason::kill);
  // Still serving: the session's device runs work, and a second session opens.
  c.b.alloc_pool(d, 1, 16, 64);
  auto e = c.b.schedule_named(d, {"fill", {buffer(1, 16), 2.0}});
  test_support::bounded([&] { c.b.sync(e); }, "work after the burst");
  node_attach_options again;
  again.name = "b2";
  auto ds = attach_node(c.b, "127.0.0.1", node.port(), again);
  BOOST_TEST_REQUIRE(ds.size() == 1u);
  test_support::bounded([&] { c.b.sync(c.b.schedule_named(ds[0], {"spin_ns", {int64_t{0}}})); },
                        "work in a second session after the burst");
}

BOOST_AUTO_TEST_CASE(test_nodes_sigterm_stops_a_node_cleanly) {
  node_process node{tool(), 2, "", true};
  cluster c;
  auto ds = attach_node(c.b, "127.0.0.1", node.port());
  BOOST_TEST(ds.size() == 2u);
  BOOST_TEST(node.terminate() == 0);
}

BOOST_AUTO_TEST_CASE(test_nodes_attach_to_nothing_names_the_address) {
  cluster c;
  try {
    attach_node(c.b, "127.0.0.1", 1); // nobody listens on port 1
    BOOST_ERROR("attached a node on a port nobody listens on");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "127.0.0.1:1"), e.what());
  }
}

/// A port of this machine that nothing listens on (bound and let go).
uint16_t unused_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  BOOST_TEST_REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0
            && getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  BOOST_TEST_REQUIRE(ok, "binding a port of 127.0.0.1");
  return ntohs(a.sin_port);
}

BOOST_AUTO_TEST_CASE(test_nodes_an_attach_told_to_retry_tries_an_unreachable_node_until_its_timeout) {
  cluster c;
  auto port = unused_port();
  node_attach_options o;
  o.timeout = std::chrono::milliseconds{400};
  o.retry_unreachable = true;
  try {
    attach_node(c.b, "127.0.0.1", port, o);
    BOOST_ERROR("attached a node on a port nobody listens on");
  } catch (const device_error& e) {
    // Named, with the timeout and more than one try (50 ms apart, then 100...).
    BOOST_TEST(contains(e.what(), "127.0.0.1:" + std::to_string(port) + " within 400 ms"), e.what());
    BOOST_TEST(!contains(e.what(), "(1 tries)"), e.what());
  }
}

BOOST_AUTO_TEST_CASE(test_nodes_an_attach_told_to_retry_attaches_a_node_that_comes_up_meanwhile) {
  cluster c;
  auto port = unused_port();
  node_attach_options o;
  o.timeout = std::chrono::seconds{60};
  // Not told to: nothing listens there yet, so it fails at once.
  BOOST_CHECK_EXCEPTION(attach_node(c.b, "127.0.0.1", port, o), device_error,
                        [](const device_error& e) { return contains(e.what(), "cannot reach"); });
  o.retry_unreachable = true;
  auto attached = std::async(std::launch::async, [&] { return attach_node(c.b, "127.0.0.1", port, o); });
  // The node comes up after the attach began (a process start: its first
  // tries are refused); the attach takes it once it listens.
  node_process node{tool(), 1, "b", true, {}, port};
  BOOST_TEST_REQUIRE((attached.wait_for(std::chrono::seconds{90}) == std::future_status::ready));
  auto ds = attached.get();
  BOOST_TEST_REQUIRE(ds.size() == 1u);
  test_support::sync(c.b, c.b.schedule_named(ds[0], {"spin_ns", {int64_t{0}}}));
}

BOOST_AUTO_TEST_CASE(test_nodes_a_backend_of_its_own_attaches_and_a_system_without_heartbeats_is_refused) {
  node_process node{tool(), 1, "b", true};
  {
    backend own{{.num_devices = 1}}; // its own system: middleman and heartbeats
    auto ds = attach_node(own, "127.0.0.1", node.port());
    BOOST_TEST_REQUIRE(ds.size() == 1u);
    own.sync(own.schedule_named(ds[0], {"spin_ns", {int64_t{0}}}));
  }
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  register_types(cfg);
  caf::actor_system sys{cfg};
  backend b{sys, {.num_devices = 1}};
  try {
    attach_node(b, "127.0.0.1", node.port());
    BOOST_ERROR("attached a node from a system without heartbeats");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "heartbeat"), e.what());
    BOOST_TEST(contains(e.what(), node.address()), e.what());
  }
}

BOOST_AUTO_TEST_CASE(test_nodes_waits_of_a_node_that_went_away_are_dropped_by_their_owner) {
  // A node's device waits for a local event that is held back; the node is
  // killed. The local device forgets that wait (it held the node's handle
  // until the event resolved, maybe never) instead of answering a dead peer.
  auto node = std::make_unique<node_process>(tool(), 1, "b", true);
  cluster c;
  auto& b = c.b;
  auto ds = attach_node(b, "127.0.0.1", node->port());
  BOOST_TEST_REQUIRE(ds.size() == 1u);
  auto local = b.get_device(0);
  std::atomic<bool> go{false};
  b.schedule_task(local, {"hold", [&go] { go.wait(false); }});
  auto held = b.all_work(local);
  b.will_wait_for(b.make_context(ds[0]), held);
  auto after = b.schedule_named(ds[0], {"spin_ns", {int64_t{0}}});
  auto waiters = [&] { return b.get_debug_info(local).to_string(); };
  auto until = [&](const std::string& what) {
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!contains(waiters(), what) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    return contains(waiters(), what);
  };
  BOOST_TEST(until("(waiters 1)"), waiters());
  node->kill9();
  BOOST_TEST(until("(waiters 0)"), waiters());
  go.store(true);
  go.notify_one();
  b.sync(held);
  BOOST_CHECK_THROW(test_support::bounded([&] { b.sync(after); }, "sync on the dead node"),
                    device_error);
}

BOOST_FIXTURE_TEST_CASE(test_nodes_a_wait_between_two_nodes_names_the_dead_owner_and_a_later_depend_is_refused,
                        two_nodes) {
  // b/0 waits for a/0's work; a is killed. b/0's work behind the wait fails
  // naming a's device, and a `depend` on a's actor sent to b/0 afterwards is
  // refused at once.
  b.schedule_named(a0, {"spin_ns", {int64_t{30'000'000'000}}});
  auto pending = b.schedule_named(a0, {"spin_ns", {int64_t{0}}});
  b.will_wait_for(b.make_context(b0), pending);
  auto behind = b.schedule_named(b0, {"spin_ns", {int64_t{0}}});
  na->kill9();
  try {
    test_support::bounded([&] { b.sync(behind); }, "sync behind the dead node");
    BOOST_ERROR("work behind a wait on a dead node succeeded");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "a/multidev_cpu"), e.what());
    BOOST_TEST(contains(e.what(), "b/"), e.what());
  }
  BOOST_TEST(b.recover(b0));
  caf::scoped_actor self{c.sys};
  std::string refusal;
  self->request(device_actor_of(b, b0), 30s, atoms::depend_atom::value,
                caf::actor_cast<caf::actor>(device_actor_of(b, a0)), pending.seq(),
                std::string{"a/multidev_cpu:0:0"})
    .receive([&](uint64_t) {}, [&](caf::error& e) { refusal = describe_error(e); });
  BOOST_TEST(contains(refusal, "it is down"), refusal);
  // The work sent after the refused depend does not run as if it had
  // waited: it fails. Recovered, the device works again.
  BOOST_CHECK_THROW(
    test_support::bounded([&] { b.sync(b.schedule_named(b0, {"spin_ns", {int64_t{0}}})); },
                          "sync after the refused depend"),
    device_error);
  BOOST_TEST(b.recover(b0));
  b.sync(b.schedule_named(b0, {"spin_ns", {int64_t{0}}}));
}

BOOST_AUTO_TEST_CASE(test_nodes_live_progress_survives_a_node_killed_mid_run) {
  // The progress thread asks every device how far it got, also the devices
  // of a node the script kills: it must go on with what it knew (it threw
  // out of the thread before, which terminated the run on a terminal).
  auto p = scenario::load_file(std::string{MULTIDEV_SOURCE_DIR} + "/examples/scenarios/two_nodes.scn");
  scenario::run_options o;
  o.spawn_nodes = true;
  o.tool = tool();
  std::atomic<int> reports{0};
  o.on_progress = [&](const std::vector<scenario::device_progress>&) { ++reports; };
  o.progress_after_s = 0;
  o.progress_interval_s = 0.001;
  auto r = scenario::run(*p, o);
  BOOST_TEST(r.ok(), scenario::summary(r));
  BOOST_TEST(reports.load() > 0);
}

BOOST_AUTO_TEST_CASE(test_nodes_provenance_survives_three_hops_between_two_nodes) {
  // A failure starts on a/0 and travels b -> a -> b: b/1 waits for a/1,
  // which waits for b/0, which waits for a/0's failing task. Each node hands
  // the failure on in its own names; here every device is named as this
  // process names it (a/0 is `a/...` even after it passed through b).
  // Then one that starts here: a/0 waits for b/0, which waits for a local
  // task that throws; the local device comes back under its own name.
  node_process na{tool(), 2, "a", true};
  node_process nb{tool(), 2, "b", true};
  cluster c;
  auto& b = c.b;
  auto on_a = attach_node(b, "127.0.0.1", na.port());
  auto on_b = attach_node(b, "127.0.0.1", nb.port());
  BOOST_TEST_REQUIRE(on_a.size() == 2u);
  BOOST_TEST_REQUIRE(on_b.size() == 2u);
  auto a0 = on_a[0], a1 = on_a[1], b0 = on_b[0], b1 = on_b[1];
  {
    // a/0 is busy first, so that the chain is in place before it fails.
    b.schedule_named(a0, {"spin_ns", {int64_t{200'000'000}}});
    auto e0 = b.schedule_named(a0, {"fail", {std::string{"boom"}}});
    b.will_wait_for(b.make_context(b0), e0); // b on a
    auto e1 = b.all_work(b0);
    b.will_wait_for(b.make_context(a1), e1); // a on b
    auto e2 = b.all_work(a1);
    b.will_wait_for(b.make_context(b1), e2); // b on a
    auto e3 = b.all_work(b1);
    failure_hop b0_on_a0{b0.name(), a0.name(), e0.seq()};
    failure_hop a1_on_b0{a1.name(), b0.name(), e1.seq()};
    failure_hop b1_on_a1{b1.name(), a1.name(), e2.seq()};
    const std::string task = "(fail boom)";
    using test_support::check_task_chain;
    using test_support::sync_error;
    check_task_chain(sync_error(b, e0, "a/0"), a0.name(), task, e0.seq(), "boom", {}, "a/0");
    check_task_chain(sync_error(b, e1, "b/0"), a0.name(), task, e0.seq(), "boom", {b0_on_a0},
                     "b/0");
    check_task_chain(sync_error(b, e2, "a/1"), a0.name(), task, e0.seq(), "boom",
                     {a1_on_b0, b0_on_a0}, "a/1");
    auto last = sync_error(b, e3, "b/1");
    check_task_chain(last, a0.name(), task, e0.seq(), "boom", {b1_on_a1, a1_on_b0, b0_on_a0},
                     "b/1");
    BOOST_TEST_MESSAGE("three hops: " << (last ? last->what() : "none"));
  }
  BOOST_TEST(b.recover(a0));
  BOOST_TEST(b.recover(b0));
  {
    auto local = b.get_device(0);
    auto release = std::make_shared<std::promise<void>>();
    auto open = release->get_future().share();
    b.schedule_task(local, {"local step", [open] {
                              if (open.wait_for(30s) != std::future_status::ready)
                                throw std::runtime_error("never released");
                              throw std::runtime_error("local boom");
                            }});
    auto e0 = b.all_work(local);
    b.will_wait_for(b.make_context(b0), e0); // b on here
    auto e1 = b.all_work(b0);
    b.will_wait_for(b.make_context(a0), e1); // a on b
    auto e2 = b.all_work(a0);
    release->set_value();
    failure_hop b0_on_local{b0.name(), local.name(), e0.seq()};
    failure_hop a0_on_b0{a0.name(), b0.name(), e1.seq()};
    auto last = test_support::sync_error(b, e2, "a/0");
    test_support::check_task_chain(last, local.name(), "local step", e0.seq(), "local boom",
                                   {a0_on_b0, b0_on_local}, "a/0");
    BOOST_TEST_MESSAGE("from here and back: " << (last ? last->what() : "none"));
  }
}

BOOST_AUTO_TEST_CASE(test_nodes_provenance_names_a_killed_node_as_the_origin_through_three_hops) {
  // a/0 is busy when node a is killed. b/0 waits for it (through this
  // process: b never connected to a), the local device waits for b/0, and
  // b/1 waits for the local device. Every wait fails, and each failure names
  // a/0 as its origin, lost, with the hops that led there.
  auto na = std::make_unique<node_process>(tool(), 1, "a", true);
  node_process nb{tool(), 2, "b", true};
  cluster c;
  auto& b = c.b;
  auto on_a = attach_node(b, "127.0.0.1", na->port());
  auto on_b = attach_node(b, "127.0.0.1", nb.port());
  BOOST_TEST_REQUIRE(on_a.size() == 1u);
  BOOST_TEST_REQUIRE(on_b.size() == 2u);
  auto a0 = on_a[0], b0 = on_b[0], b1 = on_b[1];
  auto local = b.get_device(0);
  auto doomed = b.schedule_named(a0, {"spin_ns", {int64_t{30'000'000'000}}});
  b.will_wait_for(b.make_context(b0), doomed); // b on a
  auto x1 = b.all_work(b0);
  b.will_wait_for(b.make_context(local), x1); // here on b
  auto x2 = b.all_work(local);
  b.will_wait_for(b.make_context(b1), x2); // b on here
  auto x3 = b.all_work(b1);
  BOOST_TEST(!b.is_done(x3));
  auto start = std::chrono::steady_clock::now();
  na->kill9();
  failure_hop b0_on_a0{b0.name(), a0.name(), doomed.seq()};
  failure_hop local_on_b0{local.name(), b0.name(), x1.seq()};
  failure_hop b1_on_local{b1.name(), local.name(), x2.seq()};
  using test_support::check_lost_chain;
  using test_support::sync_error;
  check_lost_chain(sync_error(b, doomed, "a/0"), a0.name(), {}, "a/0");
  check_lost_chain(sync_error(b, x1, "b/0"), a0.name(), {b0_on_a0}, "b/0");
  check_lost_chain(sync_error(b, x2, "local"), a0.name(), {local_on_b0, b0_on_a0}, "local");
  auto last = sync_error(b, x3, "b/1");
  check_lost_chain(last, a0.name(), {b1_on_local, local_on_b0, b0_on_a0}, "b/1");
  BOOST_TEST_MESSAGE("after the loss: " << (last ? last->what() : "none"));
  BOOST_TEST((std::chrono::steady_clock::now() - start < 10s));
}

BOOST_FIXTURE_TEST_CASE(test_nodes_a_batch_in_parts_with_a_bad_spec_at_the_end_schedules_none, axpy_on_a_node) {
  // More than 4,096 tasks go to a node in parts. A bad spec in the last part
  // (after two good ones) schedules none of the batch: the node's device
  // has scheduled nothing more, stays idle, and y is unchanged; the same for
  // a spec naming a pool the node does not have. A good batch in parts
  // after them runs each task once.
  b.sync(y_zeroed);
  auto before = b.all_work(d).seq();
  std::vector<task_spec> specs(2 * 4096 + 10, task_spec{"axpy", {y, 1.0, x}});
  std::vector<task_spec> bad_ones{{"no_such_kernel", {}},
                                  {"axpy", {buffer_arg{buffer_loc{77, 0}, 4}, 1.0, x}}};
  for (const auto& bad : bad_ones) {
    specs.back() = bad;
    try {
      b.schedule_batch(d, specs);
      BOOST_ERROR("a batch with a bad last spec was scheduled");
    } catch (const std::invalid_argument& e) {
      BOOST_TEST_MESSAGE("refused: " << e.what());
    }
    BOOST_TEST(b.all_work(d).seq() == before);
    // is_idle answers from what this process knows, asking without waiting.
    BOOST_TEST(test_support::eventually([&] { return b.is_idle(d); }));
  }
  b.sync(b.schedule_named(d, {"checksum", {y, std::string{"after_bad"}}}));
  auto r = b.result(d, "after_bad");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == 0.0);
  specs.back() = task_spec{"axpy", {y, 1.0, x}};
  auto events = b.schedule_batch(d, specs);
  BOOST_TEST_REQUIRE(events.size() == specs.size());
  b.sync(b.schedule_named(d, {"checksum", {y, std::string{"after_good"}}}));
  BOOST_TEST(test_support::eventually([&] { return b.is_done(events.back()); }));
  r = b.result(d, "after_good");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == static_cast<double>(specs.size()));
}

BOOST_AUTO_TEST_CASE(test_nodes_a_batch_part_out_of_order_drops_its_batch) {
  // The protocol's batch in parts, sent by hand: a part that skips one, or
  // belongs to no open batch, is refused and schedules nothing; part 0 of a
  // new batch then starts afresh.
  in_process_nodes p;
  auto ds = attach_node(p.client, "127.0.0.1", p.serve("n", {p.device(0)}));
  BOOST_TEST_REQUIRE(ds.size() == 1u);
  auto a = device_actor_of(p.client, ds[0]);
  auto before = p.client.all_work(ds[0]).seq();
  std::vector<task_spec> part(3, task_spec{"spin_ns", {int64_t{0}}});
  caf::scoped_actor self{p.client.system()};
  auto send = [&](uint64_t batch, uint32_t n, bool last) {
    std::string outcome;
    self->request(a, std::chrono::seconds{30}, atoms::schedule_atom::value, batch, n, part, last)
      .receive([&](std::vector<uint64_t>& seqs) { outcome = std::to_string(seqs.size()) + " seqs"; },
               [&](caf::error& e) { outcome = describe_error(e); });
    return outcome;
  };
  BOOST_TEST(send(1, 0, false) == "0 seqs");
  auto skipped = send(1, 2, true);
  BOOST_TEST(contains(skipped, "part 2 came where part 1 was expected"), skipped);
  auto orphan = send(1, 1, true);
  BOOST_TEST(contains(orphan, "belongs to no open batch"), orphan);
  BOOST_TEST(p.client.all_work(ds[0]).seq() == before);
  BOOST_TEST(send(2, 0, false) == "0 seqs");
  BOOST_TEST(send(2, 1, true) == "6 seqs");
  BOOST_TEST(p.client.all_work(ds[0]).seq() == before + 6);
}

BOOST_AUTO_TEST_CASE(test_nodes_refusals_of_a_nodes_device_name_it_with_its_node) {
  // The node's device is multidev_cpu:0:1 there, a name a device of this
  // process may have too: every refusal names it n/multidev_cpu:0:1.
  node_process node{tool(), 1, "n", true};
  cluster c;
  auto& b = c.b;
  auto d = attach_one(b, node);
  auto ours = d.name();
  BOOST_TEST_REQUIRE(ours.starts_with("n/"));
  auto theirs = ours.substr(2);
  auto names_it = [&](const char* call, const std::function<void()>& f) {
    try {
      f();
      BOOST_ERROR(call << " was not refused");
    } catch (const std::exception& e) {
      std::string what = e.what();
      BOOST_TEST(contains(what, ours), call << ": " << what);
      // and never without its node
      for (auto at = what.find(theirs); at != std::string::npos; at = what.find(theirs, at + 1))
        BOOST_TEST((at >= 2 && what.compare(at - 2, 2, "n/") == 0), call << ": " << what);
    }
  };
  names_it("memset_zero", [&] { b.memset_zero(d, 1000, 0, 8); });
  names_it("free_pool", [&] { b.free_pool(d, 1000); });
  names_it("alloc_pool", [&] { b.alloc_pool(d, 5, 64, 3); });
  b.alloc_pool(d, 5, 64, 64);
  names_it("memset_zero out of range", [&] { b.memset_zero(d, 5, 32, 64); });
  names_it("schedule_named", [&] { b.schedule_named(d, {"fill", {buffer(1000, 8), 1.0}}); });
  names_it("schedule_batch", [&] {
    b.schedule_batch(d, std::vector<task_spec>{{"fill", {buffer(1000, 8), 1.0}}});
  });
}

BOOST_AUTO_TEST_CASE(test_nodes_attach_node_that_fails_part_way_leaves_nothing_attached) {
  // A node whose second device does not answer `identify`: attach_node
  // throws and the first device is not left attached (no link, no entry in
  // the debug info). Then the node, attached with its two real devices,
  // lists again with another count: refused, and the third device is not
  // left attached either.
  in_process_nodes p;
  auto& b = p.client;
  auto attached = [&] {
    auto info = b.get_global_debug_info();
    auto* a = info.find("attached");
    return a ? a->to_string() : std::string{};
  };
  // The attached devices' own debug info names them as the node does.
  // The debug info names a node's devices as this process does (n/...).
  auto name_of = [&](int i) { return "(name n/" + p.server.get_device(i).name() + ")"; };
  try {
    attach_node(b, "127.0.0.1", p.serve("n", {p.device(0), p.bogus("not a device")}));
    BOOST_ERROR("a node with a device that does not answer was attached");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "not a device"), e.what());
  }
  BOOST_TEST(b.num_devices() == 1);
  BOOST_TEST(attached() == "", attached());
  auto ds = attach_node(b, "127.0.0.1", p.serve("n", {p.device(0), p.device(1)}));
  BOOST_TEST_REQUIRE(ds.size() == 2u);
  BOOST_TEST(ds[0].ordinal() == 1);
  BOOST_TEST(ds[0].name() == "n/" + p.server.get_device(0).name());
  BOOST_TEST(b.num_devices() == 3);
  try {
    attach_node(b, "127.0.0.1", p.serve("n", {p.device(2)}));
    BOOST_ERROR("a node whose device count changed was attached");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "attached before with 2 device(s), it has 1 now"), e.what());
  }
  BOOST_TEST(b.num_devices() == 3);
  auto now = attached();
  BOOST_TEST(contains(now, name_of(0)), now);
  BOOST_TEST(contains(now, name_of(1)), now);
  BOOST_TEST(!contains(now, name_of(2)), now);
  b.sync(b.schedule_named(ds[1], {"spin_ns", {int64_t{0}}}));
}

BOOST_AUTO_TEST_CASE(test_nodes_a_request_that_changes_a_node_has_no_timeout_and_runs_once) {
  // The node's device is held with a full queue, so a schedule and an alloc
  // sent to it wait there, unanswered, far longer than the (shortened)
  // timeout of the queries. Neither fails meanwhile: a request the device
  // may still carry out fails only with the node's loss, never by a
  // timeout, so nobody retries one that will run. Once the queue drains
  // each gets its reply and ran exactly once.
  in_process_nodes p{{.num_devices = 1, .queue_capacity = 4}};
  auto sd = p.server.get_device(0);
  auto ds = attach_node(p.client, "127.0.0.1", p.serve("n", {p.device(0)}));
  BOOST_TEST_REQUIRE(ds.size() == 1u);
  auto d = ds[0];
  auto release = test_support::block_runner(p.server, sd);
  auto* core = sd.get_runner().local_core();
  BOOST_TEST_REQUIRE(core != nullptr);
  while (core->has_room())
    p.server.schedule_task(sd, {"fill", [] {}});
  auto before = p.server.all_work(sd).seq();
  query_timeout_guard shortened{std::chrono::milliseconds{200}};
  auto scheduled = std::async(std::launch::async, [&] {
    return p.client.schedule_named(d, {"spin_ns", {int64_t{0}}});
  });
  auto allocated = std::async(std::launch::async, [&] { p.client.alloc_pool(d, 7, 4096, 64); });
  bool held = scheduled.wait_for(2s) == std::future_status::timeout;
  held = allocated.wait_for(0s) == std::future_status::timeout && held;
  release->open();
  BOOST_TEST(held, "a request to the held node's device was answered (a timeout?) before "
                   "the queue drained");
  auto ev = test_support::bounded([&] { return scheduled.get(); }, "schedule on the node");
  test_support::bounded([&] { allocated.get(); }, "alloc on the node");
  p.client.sync(ev);
  BOOST_TEST(p.server.all_work(sd).seq() == before + 1);
  BOOST_TEST(p.client.get_used_memory(d) >= 4096u);
}

BOOST_FIXTURE_TEST_CASE(test_nodes_a_chain_between_two_nodes_goes_straight_from_node_to_node, two_nodes) {
  // A chain that crosses between nodes a and b 200 times, built while a
  // waits on a held local task, then released: each crossing is a wait of
  // one node's device on the other's event. Its messages go straight between
  // the nodes, so this process receives next to nothing while the chain runs
  // (through this process, each crossing's reply would pass here: ~100 bytes
  // each, ~20 KB in all).
  auto local = b.get_device(0);
  auto release = hold(b, local);
  auto ctx_a = b.make_context(a0), ctx_b = b.make_context(b0);
  b.will_wait_for(ctx_a, b.all_work(local));
  constexpr int crossings = 200;
  event last;
  for (int i = 0; i < crossings / 2; ++i) {
    b.will_wait_for(ctx_b, b.schedule_named(a0, {"spin_ns", {int64_t{0}}})); // b on a
    last = b.schedule_named(b0, {"spin_ns", {int64_t{0}}});
    b.will_wait_for(ctx_a, last); // a on b
  }
  last = b.schedule_named(a0, {"spin_ns", {int64_t{0}}});
  BOOST_TEST(!b.is_done(last));
  auto before = tcp_bytes_received();
  release->set_value();
  test_support::bounded([&] { b.sync(last); }, "sync at the end of the chain");
  auto received = tcp_bytes_received() - before;
  BOOST_TEST_MESSAGE("bytes received here while " << crossings
                                                  << " crossings ran: " << received);
  // This process's own wait for the end (and a heartbeat or two) only.
  BOOST_TEST(received < 2048u, received << " bytes passed through this process");
}

struct a_64MiB_node_on_each : a_node_on_each {
  static constexpr std::size_t bytes = std::size_t{64} << 20;
  a_64MiB_node_on_each() : a_node_on_each(bytes) {
  }
};

BOOST_FIXTURE_TEST_CASE(test_nodes_a_64MiB_copy_between_two_nodes_goes_straight_and_the_call_returns_at_once,
                        a_64MiB_node_on_each) {
  // 64 MiB on a/0 (a pattern written there), copied to b/0 while a/0 waits
  // on a held local task: device_to_device returns before a/0 has read a
  // byte, the bytes go from a to b without passing through this process,
  // and b/0's copy hashes as a/0's original does.
  buffer_arg on_a{ca.buffers.at(t), bytes}, on_b{cb.buffers.at(t), bytes};
  b.schedule_named(a0, {"iota", {on_a, 0.5}});
  b.schedule_named(b0, {"fill", {on_b, 0.0}});
  auto local = b.get_device(0);
  auto release = hold(b, local);
  b.will_wait_for(ca, b.all_work(local));
  auto before = tcp_bytes_received();
  test_support::bounded([&] { BOOST_TEST(b.device_to_device(t, merge_buffer_use::no, cb, ca).has_value()); },
                        "device_to_device between two nodes", 10s);
  auto copied = b.all_work(b0);
  BOOST_TEST(!b.is_done(copied)); // a/0 has not read yet
  release->set_value();
  test_support::bounded([&] { b.sync(copied); }, "sync on the copy");
  auto received = tcp_bytes_received() - before;
  BOOST_TEST_MESSAGE("bytes received here during a 64 MiB copy a -> b: " << received);
  BOOST_TEST(received < (std::size_t{1} << 20), received << " bytes passed through this process");
  auto sum_a = b.schedule_named(a0, {"checksum", {on_a, std::string{"a_sum"}}});
  auto sum_b = b.schedule_named(b0, {"checksum", {on_b, std::string{"b_sum"}}});
  b.sync(sum_a);
  b.sync(sum_b);
  auto ra = b.result(a0, "a_sum"), rb = b.result(b0, "b_sum");
  BOOST_TEST_REQUIRE((ra && rb));
  BOOST_TEST(ra->count == bytes / sizeof(float));
  BOOST_TEST((*ra == *rb));
}

struct a_4KiB_node_on_each : a_node_on_each {
  a_4KiB_node_on_each() : a_node_on_each(4096) {
  }
};

BOOST_FIXTURE_TEST_CASE(test_nodes_a_copy_between_two_nodes_fails_with_its_source, a_4KiB_node_on_each) {
  // The read on a/0 fails (a/0 failed before it): b/0's write fails with
  // a/0's failure, and b/0 can be recovered.
  b.schedule_named(a0, {"spin_ns", {int64_t{100'000'000}}});
  b.schedule_named(a0, {"fail", {std::string{"source boom"}}});
  BOOST_TEST(b.device_to_device(t, merge_buffer_use::no, cb, ca).has_value());
  expect_copy_fails_and_b0_recovers(*this, b.all_work(b0), "source boom", "sync on the failed copy",
                                    "a copy from a failed device succeeded");
}

BOOST_FIXTURE_TEST_CASE(test_nodes_a_copy_from_a_node_killed_before_it_read_fails_naming_it, a_4KiB_node_on_each) {
  // a/0 is busy for 30 s when a copy a -> b is asked (the call returns at
  // once), then node a is killed: b/0's write, which waits for a's bytes,
  // fails naming a/0 instead of waiting forever, and b/0 recovers.
  b.schedule_named(a0, {"spin_ns", {int64_t{30'000'000'000}}});
  test_support::bounded(
    [&] { BOOST_TEST(b.device_to_device(t, merge_buffer_use::no, cb, ca).has_value()); },
    "device_to_device from a busy node", 10s);
  auto copied = b.all_work(b0);
  na->kill9();
  expect_copy_fails_and_b0_recovers(*this, copied, "a/multidev_cpu", "sync on a copy from a killed node",
                                    "a copy from a killed node succeeded");
}

namespace {

/// Nodes a, b and c (over TLS with `tls`); b is lost `how`. Only b's work,
/// and what waits on it, fails: the work queued on a and c before the loss
/// completes, and they take new work, a wait of a on c too.
void one_nodes_loss_fails_only_its_work(loss how, bool tls) {
  auto args = tls ? node_tls_args() : std::vector<std::string>{};
  node_process na{tool(), 1, "a", true, args};
  node_process nb{tool(), 1, "b", true, args};
  node_process nc{tool(), 1, "c", true, args};
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  register_types(cfg);
  cfg.set("scheduler.max-threads", size_t{2});
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds{500}});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds{3}});
  if (tls)
    configure_tls(cfg, *test_certificates());
  caf::actor_system sys{cfg};
  backend b{sys, {.num_devices = 1}};
  auto a = attach_one(b, na), bd = attach_one(b, nb), c = attach_one(b, nc);
  // Work on a, b and c waits on a local task the test holds open.
  auto local = b.get_device(0);
  std::atomic<bool> open{false};
  b.schedule_task(local, {"hold", [&] {
                            while (!open.load())
                              open.wait(false);
                          }});
  struct release_guard {
    std::atomic<bool>& open;
    ~release_guard() {
      open.store(true);
      open.notify_all();
    }
  } release{open};
  auto held = b.all_work(local);
  std::map<std::string, event> queued;
  for (const auto& d : {a, bd, c}) {
    b.will_wait_for(b.make_context(d), held);
    queued[d.name()] = b.schedule_named(d, {"spin_ns", {int64_t{0}}});
  }
  switch (how) {
    case loss::kill9: nb.kill9(); break;
    case loss::sigterm: BOOST_TEST(nb.terminate() == 0); break;
    case loss::sigstop: nb.pause(); break;
  }
  try {
    test_support::bounded([&] { b.sync(queued.at(bd.name())); }, "sync on the lost node");
    BOOST_ERROR("the lost node's work succeeded");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "b/"), e.what());
  }
  open.store(true);
  open.notify_all();
  for (const auto& d : {a, c}) {
    BOOST_CHECK_NO_THROW(test_support::bounded([&] { b.sync(queued.at(d.name())); },
                                               "sync on a node that was not lost"));
    BOOST_CHECK_NO_THROW(test_support::bounded(
      [&] { b.sync(b.schedule_named(d, {"spin_ns", {int64_t{0}}})); }, "new work on a node"));
  }
  auto on_c = b.schedule_named(c, {"spin_ns", {int64_t{0}}});
  b.will_wait_for(b.make_context(a), on_c);
  BOOST_CHECK_NO_THROW(test_support::bounded(
    [&] { b.sync(b.schedule_named(a, {"spin_ns", {int64_t{0}}})); }, "a after c"));
  if (how == loss::sigstop)
    nb.kill9(); // stopped: no need to wait for it
}

} // namespace

// -- sessions and leases (issue 37 points 1-3) ---------------------------------

namespace {

/// Short leases, so that the tests that lose a node are quick: lease 1 s,
/// renewed every 250 ms, margin 500 ms.
node_attach_options short_lease() {
  node_attach_options o;
  o.lease = 1s;
  o.renew_every = 250ms;
  o.margin = 500ms;
  return o;
}

/// The node's own account of its sessions (`debug_atom`), asked from `sys`.
std::string node_debug(caf::actor_system& sys, uint16_t port) {
  auto node = sys.middleman().remote_actor<node_actor>("127.0.0.1", port);
  if (!node)
    return "unreachable: " + sys.render(node.error());
  caf::scoped_actor self{sys};
  std::string text;
  self->request(*node, 10s, atoms::debug_atom::value)
    .receive([&](std::string& t) { text = std::move(t); },
             [&](caf::error& e) { text = "error: " + sys.render(e); });
  return text;
}

} // namespace

BOOST_TEST_DECORATOR(*boost::unit_test::precondition(have_certificates))
BOOST_DATA_TEST_CASE(test_nodes_over_tls_one_nodes_loss_fails_only_its_work,
                     boost::unit_test::data::make({loss::kill9, loss::sigterm, loss::sigstop}),
                     how) {
  // CAF 0.17's OpenSSL module closed every TLS connection once one ended
  // (actors/remote/tls_middleman.hpp): a and c failed with b.
  BOOST_TEST_REQUIRE(test_certificates().has_value());
  one_nodes_loss_fails_only_its_work(how, true);
}

BOOST_TEST_DECORATOR(*boost::unit_test::precondition(have_certificates))
BOOST_AUTO_TEST_CASE(test_nodes_a_tls_connection_to_a_node_slower_than_a_heartbeat_is_kept) {
  // CAF 0.17.6's BASP broker closes a connection it made at its next
  // heartbeat tick unless the server's handshake came first
  // (actors/remote/tls_middleman.cpp, finish_client_handshake). Over TLS, with the
  // handshake run after the broker took the connection, a route between
  // two nodes made on a loaded machine was closed so, and the server
  // dropped the proxies it had made over it: a copy's bytes were lost and
  // its destination waited forever. Here the node is stopped while the
  // connection is made and resumed after three heartbeat intervals: the
  // connection is made (before the fix: connection_timeout).
  BOOST_TEST_REQUIRE(test_certificates().has_value());
  node_process node{tool(), 1, "slow", true, node_tls_args()};
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  register_types(cfg);
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds{500}});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds{3}});
  configure_tls(cfg, *test_certificates());
  caf::actor_system sys{cfg};
  multidev::detail::use_clean_tls(sys);
  node.pause();
  // The node's pause is the condition under test (a server slower than a
  // heartbeat interval), not a synchronization.
  std::thread resume{[&] {
    std::this_thread::sleep_for(1500ms);
    node.resume();
  }};
  std::string outcome;
  {
    caf::scoped_actor self{sys};
    self->request(sys.openssl_manager().actor_handle(), 20s, caf::connect_atom_v,
                  std::string{"127.0.0.1"}, node.port())
      .receive([&](caf::node_id& id, caf::strong_actor_ptr&,
                   std::set<std::string>&) { outcome = id ? "connected" : "no node id"; },
               [&](caf::error& e) { outcome = sys.render(e); });
  }
  resume.join();
  BOOST_TEST(outcome == "connected", outcome);
}

BOOST_DATA_TEST_CASE(test_nodes_over_tcp_one_nodes_loss_fails_only_its_work,
                     boost::unit_test::data::make({loss::kill9, loss::sigterm, loss::sigstop}),
                     how) {
  one_nodes_loss_fails_only_its_work(how, false);
}

BOOST_AUTO_TEST_CASE(test_nodes_a_renewal_whose_acknowledgement_was_lost_extends_no_lease) {
  // A client counts its lease from the last acknowledgement it received; a
  // node that extended the lease from a renewal whose acknowledgement never
  // arrived would run the session's items after the client's verdict. The
  // node says where each session's lease ends (`lease_until_ns`, its steady
  // clock), so this reads what each renewal moved, with no timing: renewals
  // saying they heard no acknowledgement (acked 0, the open) leave it where
  // the open put it; one naming an acknowledged predecessor moves it to that
  // one's receipt plus the lease. The lease is long: nothing here expires.
  backend srv{{.num_devices = 1}};
  auto node = spawn_node_actor(srv, "n");
  caf::scoped_actor self{srv.system()};
  constexpr auto lease = 60s;
  constexpr int64_t lease_ns = std::chrono::nanoseconds{lease}.count();
  auto steady_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
  };
  uint64_t id = 0;
  auto before_open = steady_ns();
  self->request(node, 10s, atoms::open_atom::value, std::string{"test"}, lease_ns,
                load_cookie())
    .receive([&](std::string&, std::string&, uint64_t s, int64_t, std::vector<caf::actor>&) { id = s; },
             [&](caf::error& e) { BOOST_ERROR("open: " << srv.system().render(e)); });
  auto after_open = steady_ns();
  BOOST_TEST_REQUIRE(id != 0);
  // Where the node says session `id`'s lease ends.
  auto until = [&] {
    std::string text;
    self->request(node, 10s, atoms::debug_atom::value)
      .receive([&](std::string& t) { text = std::move(t); },
               [&](caf::error& e) { BOOST_ERROR("debug: " << srv.system().render(e)); });
    auto at = text.find("(session (id " + std::to_string(id) + ")");
    BOOST_TEST_REQUIRE(at != std::string::npos, text);
    auto field = text.find("(lease_until_ns ", at);
    BOOST_TEST_REQUIRE(field != std::string::npos, text);
    return std::stoll(text.substr(field + std::strlen("(lease_until_ns ")));
  };
  auto renew = [&](uint64_t n, uint64_t acked) {
    bool granted = false;
    self->request(node, 10s, atoms::renew_atom::value, id, n, acked)
      .receive([&](int64_t) { granted = true; },
               [&](caf::error& e) { BOOST_ERROR("renew " << n << ": " << srv.system().render(e)); });
    return granted;
  };
  auto opened = until();
  BOOST_TEST((opened >= before_open + lease_ns && opened <= after_open + lease_ns), opened);
  // Renewals 1 and 2, their acknowledgements lost (the client says 0).
  BOOST_TEST(renew(1, 0));
  BOOST_TEST(renew(2, 0));
  auto before_3 = steady_ns();
  BOOST_TEST(renew(3, 0));
  auto after_3 = steady_ns();
  BOOST_TEST(until() == opened, "renewals whose acknowledgements were lost moved the lease by "
                                  << (until() - opened) << " ns");
  // Renewal 4 says it heard 3 acknowledged: the lease runs from 3's receipt.
  BOOST_TEST(renew(4, 3));
  auto moved = until();
  BOOST_TEST((moved >= before_3 + lease_ns && moved <= after_3 + lease_ns),
             "renewal 3's receipt plus the lease is in [" << before_3 + lease_ns << ", "
                                                          << after_3 + lease_ns << "], the lease ends at "
                                                          << moved);
  // A renewal naming one the node never heard (or already replaced) moves nothing.
  BOOST_TEST(renew(5, 99));
  BOOST_TEST(until() == moved);
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(test_nodes_two_clients_of_one_node_own_their_pools_and_failures) {
  // Two clients (two actor systems, as two processes would be) attach the
  // same node and use the same pool id: each reads its own bytes; a failure,
  // a cancel and a free in one are not seen by the other.
  node_process node{tool(), 1, "b", true};
  caf::actor_system sys1{cluster::make_cfg()}, sys2{cluster::make_cfg()};
  backend b1{sys1, {.num_devices = 1}}, b2{sys2, {.num_devices = 1}};
  auto d1 = attach_node(b1, "127.0.0.1", node.port()).at(0);
  auto d2 = attach_node(b2, "127.0.0.1", node.port()).at(0);
  BOOST_TEST(d1.name() != d2.name());
  b1.alloc_pool(d1, 1, 4096, 64);
  b2.alloc_pool(d2, 1, 4096, 64);
  b1.schedule_named(d1, {"fill", {buffer(1, 4096), 1.0}});
  b2.schedule_named(d2, {"fill", {buffer(1, 4096), 2.0}});
  test_support::sync(b1, b1.schedule_named(d1, {"checksum", {buffer(1, 4096), std::string{"mine"}}}));
  test_support::sync(b2, b2.schedule_named(d2, {"checksum", {buffer(1, 4096), std::string{"mine"}}}));
  auto r1 = b1.result(d1, "mine"), r2 = b2.result(d2, "mine");
  BOOST_TEST_REQUIRE(r1.has_value());
  BOOST_TEST_REQUIRE(r2.has_value());
  BOOST_TEST(r1->sum == 1024.0);
  BOOST_TEST(r2->sum == 2048.0);
  // A failure in client 1's stream: client 2's goes on.
  auto boom = b1.schedule_named(d1, {"fail", {std::string{"client 1 fails"}}});
  BOOST_CHECK_THROW(test_support::sync(b1, boom), device_error);
  auto after = b2.schedule_named(d2, {"checksum", {buffer(1, 4096), std::string{"still"}}});
  test_support::sync(b2, after); // throws if it saw client 1's failure
  BOOST_TEST((b2.state(after) == event_state::done));
  // Client 1 frees pool 1 and cancels: client 2's pool 1 is still there.
  BOOST_TEST(b1.recover(d1));
  b1.free_pool(d1, 1);
  b1.cancel(d1);
  std::vector<float> back(1024);
  auto bytes = std::as_writable_bytes(std::span{back});
  auto read = device_actor_of(b2, d2);
  {
    caf::scoped_actor self{sys2};
    std::string got;
    self->request(read, 30s, atoms::read_atom::value, int32_t{1}, uint64_t{0}, uint64_t{4096})
      .receive([&](std::string& s) { got = std::move(s); },
               [&](caf::error& e) { BOOST_ERROR("client 2's read failed: " << sys2.render(e)); });
    BOOST_TEST_REQUIRE(got.size() == bytes.size());
    std::memcpy(bytes.data(), got.data(), got.size());
  }
  BOOST_TEST(back[0] == 2.0f);
  BOOST_TEST(back[1023] == 2.0f);
}

BOOST_AUTO_TEST_CASE(test_nodes_an_item_the_client_saw_fail_never_runs_after_sigcont) {
  // The node is stopped (SIGSTOP) while a spin runs and a checksum waits
  // behind it. The client declares it lost after lease + margin; after
  // SIGCONT, the node's runner finds the lease over and cancels the
  // checksum: the node's trace of the session says so.
  node_process node{tool(), 1, "s"};
  cluster c;
  auto& b = c.b;
  auto d = attach_node(b, "127.0.0.1", node.port(), short_lease()).at(0);
  b.alloc_pool(d, 1, 64, 64);
  b.schedule_named(d, {"spin_ns", {int64_t{2'000'000'000}}});
  auto late = b.schedule_named(d, {"checksum", {buffer(1, 64), std::string{"late_sum"}}});
  BOOST_TEST_REQUIRE(test_support::eventually([&] { return !b.is_idle(d); }, 10s));
  node.pause();
  auto start = std::chrono::steady_clock::now();
  try {
    test_support::bounded([&] { b.sync(late); }, "sync on the stopped node");
    BOOST_ERROR("the stopped node's checksum succeeded");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "session ended"), e.what());
    BOOST_TEST(contains(e.what(), "node s"), e.what());
  }
  auto took = std::chrono::steady_clock::now() - start;
  // Never before the lease (1 s) and its margin (0.5 s) passed.
  BOOST_TEST((took >= 1s), std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
  node.resume();
  BOOST_TEST_REQUIRE(test_support::eventually(
    [&] { return contains(node.errors(1 << 16), "session 1 cleaned up"); }, 20s,
    std::chrono::milliseconds{20}),
    node.errors());
  auto log = node.errors(1 << 16);
  BOOST_TEST(contains(log, "0 item(s) started after it ended"), log);
  BOOST_TEST(contains(log, "(kind cancel) (description \"not run: (checksum"), log);
  BOOST_TEST(!contains(log, "(kind task) (description \"(checksum"), log);
}

namespace {
/// Where the helper client of the kill -9 test finds its node.
constexpr const char* helper_port_env = "MULTIDEV_TEST_SESSION_NODE_PORT";
} // namespace

// Not a test: the client process the kill -9 test starts (and kills). It
// attaches the node, allocates 1 MiB there, queues work behind a wait for a
// local task that never ends, says "ready", and waits to be killed.
BOOST_AUTO_TEST_CASE(helper_session_client, *boost::unit_test::disabled()) {
  const char* port = std::getenv(helper_port_env);
  BOOST_TEST_REQUIRE(port != nullptr);
  caf::actor_system sys{cluster::make_cfg()};
  backend b{sys, {.num_devices = 1}};
  auto d = attach_node(b, "127.0.0.1", static_cast<uint16_t>(std::atoi(port)), short_lease()).at(0);
  b.alloc_pool(d, 1, 1 << 20, 64);
  auto local = b.get_device(0);
  std::promise<void> never;
  auto hold = never.get_future().share();
  b.schedule_task(local, {"hold", [hold] { hold.wait(); }});
  b.will_wait_for(b.make_context(d), b.all_work(local));
  for (int i = 0; i < 3; ++i)
    b.schedule_named(d, {"fill", {buffer(1, 1 << 20), 1.0}});
  b.flush(d);
  std::cout << "ready" << std::endl;
  std::this_thread::sleep_for(10min); // killed long before
}

BOOST_AUTO_TEST_CASE(test_nodes_a_killed_client_s_session_is_freed_within_its_lease) {
  // A client (a process of its own) holds 1 MiB and queued work on the
  // node; kill -9 of it: the node ends its session (cancels the queue,
  // frees the pool) within the lease (1 s) and margin (0.5 s).
  node_process node{tool(), 1, "b"}; // its stderr kept: it says why the session ended
  cluster c;
  setenv(helper_port_env, std::to_string(node.port()).c_str(), 1);
  auto& suite = boost::unit_test::framework::master_test_suite();
  std::string self_exe = "/proc/self/exe", filter = "--run_test=helper_session_client";
  std::string dashes = "--", tool_arg = suite.argv[1];
  std::vector<char*> argv{self_exe.data(), filter.data(), dashes.data(), tool_arg.data(), nullptr};
  int out[2];
  BOOST_TEST_REQUIRE(pipe(out) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  unsetenv(helper_port_env);
  BOOST_TEST_REQUIRE(rc == 0);
  struct reap {
    pid_t pid;
    int fd;
    ~reap() {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      close(fd);
    }
  } reaped{pid, out[0]};
  std::string said;
  BOOST_TEST_REQUIRE(test_support::eventually(
    [&] {
      pollfd p{out[0], POLLIN, 0};
      if (poll(&p, 1, 0) > 0) {
        char buf[64];
        auto got = read(out[0], buf, sizeof buf);
        if (got > 0)
          said.append(buf, static_cast<std::size_t>(got));
      }
      return contains(said, "ready");
    },
    30s, std::chrono::milliseconds{10}));
  auto before = node_debug(c.sys, node.port());
  BOOST_TEST(contains(before, "(used_memory 1048576) (queued 4)"), before);
  ::kill(pid, SIGKILL);
  auto killed = std::chrono::steady_clock::now();
  std::string now;
  BOOST_TEST_REQUIRE(test_support::eventually(
    [&] {
      now = node_debug(c.sys, node.port());
      return contains(now, "(sessions) (ended 1) (cleaned 1)");
    },
    10s, std::chrono::milliseconds{20}),
    now);
  auto took = std::chrono::steady_clock::now() - killed;
  // Ended by its lease (1 s), not by anything slower: the node says so. The
  // bound on the time is loose (a loaded machine delays the polls); before
  // the fix the session never ended at all.
  BOOST_TEST(contains(node.errors(1 << 16), "its lease of 1.000 s ran out"), node.errors(1 << 16));
  BOOST_TEST((took < 1500ms + 3s), // lease + margin, and the polls' slack
             std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
}

BOOST_AUTO_TEST_CASE(test_nodes_a_restarted_node_rejoins_under_its_name_and_old_handles_say_session_ended) {
  auto n1 = std::make_unique<node_process>(tool(), 1, "b", true);
  cluster c;
  auto& b = c.b;
  auto old = attach_node(b, "127.0.0.1", n1->port(), short_lease()).at(0);
  auto pending = b.schedule_named(old, {"spin_ns", {int64_t{30'000'000'000}}});
  n1->kill9();
  BOOST_CHECK_THROW(test_support::bounded([&] { b.sync(pending); }, "sync on the dead node"),
                    device_error);
  node_process n2{tool(), 1, "b", true};
  auto fresh = attach_node(b, "127.0.0.1", n2.port(), short_lease()).at(0);
  BOOST_TEST(fresh.ordinal() == old.ordinal());
  BOOST_TEST((b.get_device(old.ordinal()) == fresh));
  // Named apart from the dead one's devices.
  BOOST_TEST(fresh.name() != old.name());
  BOOST_TEST(fresh.name().rfind("b@2/", 0) == 0, fresh.name());
  test_support::sync(b, b.schedule_named(fresh, {"spin_ns", {int64_t{0}}}));
  try {
    b.schedule_named(old, {"spin_ns", {int64_t{0}}});
    BOOST_ERROR("the dead node's device took work");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "session ended"), e.what());
    BOOST_TEST(contains(e.what(), "node b"), e.what());
  }
}

BOOST_AUTO_TEST_CASE(test_nodes_a_node_silent_then_back_is_attached_again_in_a_new_session) {
  // As after a healed partition: the node falls silent, is declared lost,
  // comes back. attach_node on the same backend opens a new session; the
  // old devices fail with "session ended", the new ones work.
  node_process node{tool(), 1, "p", true};
  cluster c;
  auto& b = c.b;
  auto old = attach_node(b, "127.0.0.1", node.port(), short_lease()).at(0);
  auto pending = b.schedule_named(old, {"spin_ns", {int64_t{0}}});
  test_support::sync(b, pending);
  node.pause();
  try {
    test_support::bounded([&] { b.sync(b.schedule_named(old, {"spin_ns", {int64_t{0}}})); },
                          "sync on the silent node");
    BOOST_ERROR("work on the silent node succeeded");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "session ended"), e.what());
  }
  node.resume();
  auto again = attach_node(b, "127.0.0.1", node.port(), short_lease()).at(0);
  BOOST_TEST(!(again == old));
  BOOST_TEST(again.ordinal() == old.ordinal());
  BOOST_TEST(again.name().rfind("p/", 0) == 0, again.name()); // the same node: no '@'
  test_support::sync(b, b.schedule_named(again, {"spin_ns", {int64_t{0}}}));
  try {
    b.recover(old);
    BOOST_ERROR("the old session's device was recovered");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "session ended"), e.what());
    BOOST_TEST(contains(e.what(), "node p"), e.what());
  }
}

BOOST_AUTO_TEST_CASE(test_nodes_node_names_are_unique_and_a_node_must_be_called_what_the_caller_says) {
  node_process b1{tool(), 1, "b", true};
  node_process b2{tool(), 1, "b", true};
  node_process z{tool(), 1, "zzz", true};
  cluster c;
  attach_node(c.b, "127.0.0.1", b1.port());
  try {
    attach_node(c.b, "127.0.0.1", b2.port());
    BOOST_ERROR("a second node named b was attached");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "unique"), e.what());
    BOOST_TEST(contains(e.what(), b2.address()), e.what());
  }
  BOOST_TEST(c.b.num_devices() == 2);
  node_attach_options o;
  o.expected_name = "a";
  try {
    attach_node(c.b, "127.0.0.1", z.port(), o);
    BOOST_ERROR("node zzz was attached as a");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "'a'"), e.what());
    BOOST_TEST(contains(e.what(), "'zzz'"), e.what());
  }
  BOOST_TEST(c.b.num_devices() == 2);
}

BOOST_AUTO_TEST_CASE(test_nodes_detach_node_ends_the_session_and_the_node_can_be_attached_again) {
  node_process node{tool(), 1, "b", true};
  cluster c;
  auto& b = c.b;
  auto d = attach_node(b, "127.0.0.1", node.port()).at(0);
  b.alloc_pool(d, 1, 1 << 20, 64);
  BOOST_TEST(contains(node_debug(c.sys, node.port()), "(used_memory 1048576)"));
  detach_node(b, "b");
  try {
    b.schedule_named(d, {"spin_ns", {int64_t{0}}});
    BOOST_ERROR("a detached node's device took work");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "session ended: node b was detached"), e.what());
  }
  std::string now;
  BOOST_TEST(test_support::eventually(
               [&] {
                 now = node_debug(c.sys, node.port());
                 return contains(now, "(sessions) (ended 1) (cleaned 1)");
               },
               10s, std::chrono::milliseconds{10}),
             now);
  BOOST_CHECK_THROW(detach_node(b, "nobody"), std::invalid_argument);
  auto again = attach_node(b, "127.0.0.1", node.port()).at(0);
  test_support::sync(b, b.schedule_named(again, {"spin_ns", {int64_t{0}}}));
}

BOOST_AUTO_TEST_CASE(test_nodes_attach_node_s_timeout_bounds_the_whole_attach) {
  // A stopped node (SIGSTOP: its port accepts, nothing answers): attach_node
  // gives up at its timeout, not before (CAF's own handshake and heartbeat
  // would end it earlier, or never), naming the address and the timeout.
  node_process node{tool(), 1, "b", true};
  cluster c;
  node.pause();
  auto start = std::chrono::steady_clock::now();
  try {
    test_support::bounded([&] { attach_node(c.b, "127.0.0.1", node.port(), 4500ms); },
                          "attach_node on a stopped node");
    BOOST_ERROR("a stopped node was attached");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), node.address()), e.what());
    BOOST_TEST(contains(e.what(), "4500 ms"), e.what());
  }
  auto took = std::chrono::steady_clock::now() - start;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  BOOST_TEST(ms >= 4400, ms << " ms");
  BOOST_TEST(ms < 8000, ms << " ms"); // the timeout, and slack for a loaded machine
  // Resumed, it attaches.
  node.resume();
  auto ds = attach_node(c.b, "127.0.0.1", node.port(), 10s);
  BOOST_TEST(ds.size() == 1u);
}

BOOST_AUTO_TEST_CASE(test_nodes_a_local_wait_on_a_killed_node_fails_no_earlier_than_the_lease) {
  // Node b is killed; its connection closes at once. A local device made to
  // wait on b's work right after must not fail before the session's lease
  // and margin passed (b may be alive behind a broken connection, running
  // that work): the reply to its wait request arrives at once (the actor is
  // unreachable), and is held until the keeper's verdict.
  auto node = std::make_unique<node_process>(tool(), 1, "b", true);
  cluster c;
  auto& b = c.b;
  auto d = attach_node(b, "127.0.0.1", node->port(), short_lease()).at(0);
  auto pending = b.schedule_named(d, {"spin_ns", {int64_t{30'000'000'000}}});
  auto local = b.get_device(0);
  node->kill9();
  auto killed = std::chrono::steady_clock::now();
  b.will_wait_for(b.make_context(local), pending);
  b.schedule_task(local, {"dependent", [] {}});
  auto dependent = b.all_work(local);
  try {
    test_support::bounded([&] { b.sync(dependent); }, "sync behind the killed node");
    BOOST_ERROR("the local dependent of the killed node's work succeeded");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "session ended"), e.what());
  }
  auto took = std::chrono::steady_clock::now() - killed;
  // The last renewal was acknowledged at most 250 ms before the kill.
  BOOST_TEST((took >= 1250ms),
             std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
}

// -- trust at the node boundary (issue 38 point 1) --------------------------------

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// A folder of this test's own, removed at the end.
struct temp_folder {
  temp_folder() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "multidev-trust.XXXXXX").string();
    BOOST_TEST_REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_folder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  /// Writes `text` into `name` with `mode`; returns its path.
  std::string file(const std::string& name, const std::string& text, mode_t mode) const {
    auto p = (path / name).string();
    {
      std::ofstream out{p};
      out << text << "\n";
    }
    BOOST_TEST_REQUIRE(::chmod(p.c_str(), mode) == 0);
    return p;
  }
  std::filesystem::path path;
};

} // namespace

BOOST_AUTO_TEST_CASE(test_nodes_a_client_with_the_wrong_cookie_gets_no_session_and_the_right_one_does) {
  temp_folder dir;
  const std::string right = "0123456789abcdef-the-right-one";
  const std::string wrong = "fedcba9876543210-the-wrong-one";
  auto right_file = dir.file("right", right, 0600);
  auto wrong_file = dir.file("wrong", wrong, 0600);
  node_process node{tool(), 1, "b", false, {"--cookie-file", right_file}};
  cluster c;
  node_attach_options o;
  o.cookie_file = wrong_file;
  std::string refusal;
  auto t0 = std::chrono::steady_clock::now();
  try {
    attach_node(c.b, "127.0.0.1", node.port(), o);
  } catch (const device_error& e) {
    refusal = e.what();
  }
  BOOST_TEST_MESSAGE("a wrong cookie refused in "
                     << ms_since(t0)
                     << " ms (connection included)");
  BOOST_TEST(contains(refusal, "node b: session refused: wrong cookie"), refusal);
  // Never the secret, either of them.
  BOOST_TEST(!contains(refusal, right), refusal);
  BOOST_TEST(!contains(refusal, wrong), refusal);
  BOOST_TEST(c.b.num_devices() == 1); // nothing attached
  BOOST_TEST(!contains(node.errors(), right));
  // The default file is another cookie than this node's: refused too.
  BOOST_CHECK_THROW(attach_node(c.b, "127.0.0.1", node.port()), device_error);
  // The node goes on serving a client with the right one.
  o.cookie_file = right_file;
  auto ds = attach_node(c.b, "127.0.0.1", node.port(), o);
  BOOST_TEST_REQUIRE(ds.size() == 1u);
  c.b.alloc_pool(ds[0], 1, 4096, 64);
  c.b.schedule_named(ds[0], {"fill", {buffer(1, 4096), 3.0}});
  test_support::sync(c.b, c.b.schedule_named(ds[0], {"checksum", {buffer(1, 4096),
                                                                  std::string{"sum"}}}));
  auto r = c.b.result(ds[0], "sum");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == 3072.0);
  // A cookie file others can read is refused before connecting, naming it.
  o.cookie_file = dir.file("open", right, 0644);
  try {
    attach_node(c.b, "127.0.0.1", node.port(), o);
    BOOST_ERROR("a cookie file of mode 0644 was accepted");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), o.cookie_file + ": mode 0644 lets others read it"), e.what());
  }
}

BOOST_AUTO_TEST_CASE(test_nodes_a_peer_with_another_session_s_device_handle_reaches_nothing) {
  // Client A (sys1) works on node b; a peer (sys2, with a session of its
  // own there) gets the handle of A's device actor, as one that guessed its
  // actor id would (BASP addresses actors by id): A's process sends it over
  // CAF to an actor the peer published. Every message of the peer to it is
  // refused or dropped: cancel, recover, read, trace, status, exit and kill,
  // asked and anonymous. A's work, queued behind a spin meanwhile, runs;
  // A's pool reads what A wrote.
  node_process node{tool(), 1, "b", true};
  caf::actor_system sys1{cluster::make_cfg()}, sys2{cluster::make_cfg()};
  backend b1{sys1, {.num_devices = 1}}, b2{sys2, {.num_devices = 1}};
  auto d1 = attach_node(b1, "127.0.0.1", node.port()).at(0);
  auto d2 = attach_node(b2, "127.0.0.1", node.port()).at(0);
  b1.alloc_pool(d1, 1, 4096, 64);
  b1.schedule_named(d1, {"fill", {buffer(1, 4096), 5.0}});
  auto spin = b1.schedule_named(d1, {"spin_ns", {int64_t{1'500'000'000}}});
  auto behind = b1.schedule_named(d1, {"checksum", {buffer(1, 4096), std::string{"behind"}}});
  // The handle, from A's process to the peer's.
  caf::scoped_actor peer{sys2};
  auto box = sys2.middleman().publish(caf::actor_cast<caf::actor>(peer), 0, "127.0.0.1");
  BOOST_TEST_REQUIRE(static_cast<bool>(box));
  {
    auto to_peer = sys1.middleman().remote_actor("127.0.0.1", *box);
    BOOST_TEST_REQUIRE(static_cast<bool>(to_peer));
    caf::anon_send(*to_peer, caf::actor_cast<caf::actor>(device_actor_of(b1, d1)));
  }
  caf::actor stolen;
  peer->receive([&](caf::actor& a) { stolen = std::move(a); },
                caf::after(std::chrono::seconds{30}) >> [] {});
  BOOST_TEST_REQUIRE(static_cast<bool>(stolen));
  BOOST_TEST((stolen.node() != sys2.node())); // a proxy of node b's actor
  // What the device said to the peer: "answered", or the error.
  std::string why;
  auto on_error = [&](caf::error& e) { why = describe_error(sys2, e); };
  auto answered = [&](auto&&...) { why = "answered"; };
  auto refused = [&](auto on_value, auto... xs) {
    why = "no reply";
    peer->request(stolen, 30s, xs...).receive(on_value, on_error);
    return why;
  };
  // Anonymous first: nothing answers them; the asked ones after them come
  // on the same connection, in order.
  caf::anon_send(stolen, atoms::cancel_atom::value);
  caf::anon_send_exit(stolen, caf::exit_reason::kill);
  peer->send_exit(stolen, caf::exit_reason::user_shutdown);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> replies{
    refused([&](uint64_t) { answered(); }, atoms::cancel_atom::value),
    refused([&](bool) { answered(); }, atoms::recover_atom::value),
    refused([&](device_trace&) { answered(); }, atoms::trace_atom::value),
    refused([&](uint8_t, uint64_t, uint64_t) { answered(); }, atoms::status_atom::value,
            uint64_t{1}),
    refused([&](std::string&) { answered(); }, atoms::read_atom::value, int32_t{1},
            uint64_t{0}, uint64_t{4096})};
  BOOST_TEST_MESSAGE("5 requests refused in "
                     << ms_since(t0)
                     << " ms: " << replies.front());
  for (const auto& reply : replies)
    BOOST_TEST(contains(reply, "refused a message from node"), reply);
  // A's work was neither cancelled nor killed: the checksum behind the spin runs.
  test_support::sync(b1, spin); // throws if cancelled or killed
  test_support::sync(b1, behind);
  auto r = b1.result(d1, "behind");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == 5120.0);
  // The peer's own session works as ever.
  test_support::sync(b2, b2.schedule_named(d2, {"spin_ns", {int64_t{0}}}));
  sys2.middleman().unpublish(caf::actor_cast<caf::actor>(peer), *box);
}

// -- forged replies (issue 38 point 2) ------------------------------------------

BOOST_AUTO_TEST_CASE(test_nodes_a_reply_from_another_owner_does_not_open_a_wait) {
  // A device's waits on remote owners share one reply sink, whose request
  // ids are sequential. Owner 2, asked for its own wait (id 2), answers it
  // and forges a reply to id 1 (owner 1's wait), named and anonymous; the
  // wait on owner 1 must stay pending until owner 1 answers.
  caf::actor_system sys{cluster::make_cfg()};
  using promise_t = caf::typed_response_promise<uint64_t>;
  auto held = std::make_shared<std::promise<promise_t>>();
  auto held_future = held->get_future();
  // Arguments, though unused: CAF 0.17 spawns a function without one
  // through a null tuple pointer (UBSan, `sanitize` preset).
  auto owner1 = sys.spawn(
    [held](caf::event_based_actor* self, int) -> caf::behavior {
      return {[self, held](atoms::wait_atom, uint64_t) -> caf::result<uint64_t> {
        auto rp = self->make_response_promise<uint64_t>();
        held->set_value(rp); // answered by the test, later
        return rp;
      }};
    },
    0);
  auto owner2 = sys.spawn(
    [](caf::event_based_actor* self, int) -> caf::behavior {
      return {[self](atoms::wait_atom, uint64_t seq) -> uint64_t {
        auto to = self->current_sender();
        auto mine = self->current_message_id().request_id().integer_value();
        auto other = caf::make_message_id(mine - 1).response_id();
        to->enqueue(self->ctrl(), other, caf::make_message(uint64_t{7}), self->context());
        to->enqueue(nullptr, other, caf::make_message(uint64_t{7}), self->context());
        return seq;
      }};
    },
    0);
  auto sink = detail::reply_sink::make(sys);
  std::atomic<bool> opened{false};
  std::promise<uint64_t> first, second;
  auto first_done = first.get_future(), second_done = second.get_future();
  BOOST_TEST_REQUIRE(sink->wait(owner1, 7, [&](const caf::message& m) {
    opened = true;
    first.set_value(m.match_elements<uint64_t>() ? m.get_as<uint64_t>(0) : 0);
  }));
  BOOST_TEST_REQUIRE(sink->wait(owner2, 8, [&](const caf::message& m) {
    second.set_value(m.match_elements<uint64_t>() ? m.get_as<uint64_t>(0) : 0);
  }));
  // Owner 2's own reply came after its forgeries, on the same thread.
  BOOST_TEST_REQUIRE((second_done.wait_for(30s) == std::future_status::ready));
  BOOST_TEST(second_done.get() == 8u);
  BOOST_TEST(!opened.load(), "owner 2's forged reply opened the wait on owner 1");
  // Owner 1's own reply opens it.
  BOOST_TEST_REQUIRE((held_future.wait_for(30s) == std::future_status::ready));
  held_future.get().deliver(uint64_t{7});
  BOOST_TEST_REQUIRE((first_done.wait_for(30s) == std::future_status::ready));
  BOOST_TEST(first_done.get() == 7u);
  sink->close(caf::make_error(caf::sec::request_receiver_down));
  caf::anon_send_exit(owner1, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(owner2, caf::exit_reason::user_shutdown);
}

// -- per-session memory quota (issue 38 point 2) -----------------------------------

BOOST_AUTO_TEST_CASE(test_nodes_an_allocation_past_the_session_s_memory_limit_is_refused) {
  // A node of two devices, 1 MiB per session: one session's pools on both
  // devices count together; another session has a quota of its own.
  node_process node{tool(), 2, "q", false, {"--memory-limit", "1M"}};
  caf::actor_system sys1{cluster::make_cfg()}, sys2{cluster::make_cfg()};
  backend b1{sys1, {.num_devices = 1}}, b2{sys2, {.num_devices = 1}};
  auto d1 = attach_node(b1, "127.0.0.1", node.port());
  auto d2 = attach_node(b2, "127.0.0.1", node.port());
  BOOST_TEST_REQUIRE(d1.size() == 2u);
  BOOST_TEST_REQUIRE(d2.size() == 2u);
  b1.alloc_pool(d1[0], 1, 600 * 1024, 64);
  std::string refusal;
  try {
    b1.alloc_pool(d1[1], 2, 600 * 1024, 64); // 1200 KiB in all
    b1.sync_device(d1[1]);
  } catch (const std::exception& e) {
    refusal = e.what();
  }
  BOOST_TEST(contains(refusal, "session 1 of node q: alloc_pool 2 of 614400 bytes refused: the "
                               "session holds 614400 bytes and its memory limit is 1048576 bytes"),
             refusal);
  // Within the quota: served; the other session has its own 1 MiB.
  b1.alloc_pool(d1[1], 3, 400 * 1024, 64);
  b2.alloc_pool(d2[0], 1, 1000 * 1024, 64);
  test_support::sync(b1, b1.schedule_named(d1[1], {"fill", {buffer(3, 400 * 1024), 1.0}}));
  test_support::sync(b2, b2.schedule_named(d2[0], {"fill", {buffer(1, 1000 * 1024), 1.0}}));
  BOOST_TEST(b1.get_used_memory(d1[0]) + b1.get_used_memory(d1[1]) <= 1024u * 1024u);
}

BOOST_AUTO_TEST_CASE(test_nodes_reads_and_writes_in_flight_count_against_the_quota) {
  // A read's buffer is the node's memory from the request to the reply, a
  // write's bytes until the write ran: queued behind a long task, they held
  // any amount of it past --memory-limit. Now a session's transfers in
  // flight hold at most its limit (besides its pools).
  node_process node{tool(), 1, "q", false, {"--memory-limit", "1M"}};
  caf::actor_system sys{cluster::make_cfg()};
  backend b{sys, {.num_devices = 1}};
  auto d = attach_node(b, "127.0.0.1", node.port());
  BOOST_TEST_REQUIRE(d.size() == 1u);
  b.alloc_pool(d[0], 1, 600 * 1024, 64);
  b.sync_device(d[0]);
  // The device busy for long: what follows stays queued (the test does not
  // wait for it; the node goes with the test).
  b.schedule_named(d[0], {"spin_ns", {int64_t{60'000'000'000}}});
  auto act = device_actor_of(b, d[0]);
  caf::scoped_actor self{sys};
  self->send(act, atoms::read_atom::value, int32_t{1}, uint64_t{0}, uint64_t{600 * 1024});
  auto read = [&](uint64_t size) {
    std::string why;
    self->request(act, 30s, atoms::read_atom::value, int32_t{1}, uint64_t{0}, size)
      .receive([&](const std::string&) { why = "accepted"; },
               [&](caf::error& e) { why = sys.render(e); });
    return why;
  };
  auto second = read(600 * 1024);
  BOOST_TEST(contains(second, "session 1 of node q: read of 614400 bytes refused: the session's "
                              "transfers in flight hold 614400 bytes and may hold at most its "
                              "memory limit, 1048576 bytes"),
             second);
  std::string write;
  self->request(act, 30s, atoms::write_atom::value, int32_t{1}, uint64_t{0},
                std::string(600 * 1024, 'x'))
    .receive([&](uint64_t) { write = "accepted"; },
             [&](caf::error& e) { write = sys.render(e); });
  BOOST_TEST(contains(write, "write of 614400 bytes refused"), write);
  // Within the limit: queued (its reply comes after the spin, unawaited).
  self->send(act, atoms::read_atom::value, int32_t{1}, uint64_t{0}, uint64_t{100 * 1024});
  auto third = read(400 * 1024);
  BOOST_TEST(contains(third, "transfers in flight hold 716800 bytes"), third);
}
