// Devices of another actor system, driven only through their actor handles
// over a real CAF middleman connection on 127.0.0.1 (`attach_device`): named
// tasks, pools, results, sync/is_done/state on their events, will_wait_for in
// all four directions (local on local, local on remote, remote on local,
// remote on remote), cancel and recover, failures coming back as device_error
// with their provenance, and the members that refuse a remote device.
//
// A failure's provenance (origin device, task, message and the path of
// waits) survives hops between processes and the loss of its origin's.
//
// The same scenario runs twice: against a second actor system in this
// process, and against a second process (this test binary started again
// with `--serve-devices`, which publishes two devices and prints their
// ports). The second process also shows that nothing hangs when it dies.
//
// Order across the two processes is checked with CLOCK_MONOTONIC (what
// std::chrono::steady_clock reads on Linux), which every process of the
// machine shares: a kernel on the remote side publishes the time it ran as a
// result, and the host compares it with the times its local tasks recorded.
#define BOOST_TEST_MODULE remote
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/io/middleman.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "test_support.hpp"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

extern char** environ;

using namespace std::chrono_literals;
using multidev::backend;
using multidev::backend_options;
using multidev::buffer_arg;
using multidev::buffer_loc;
using multidev::device;
using multidev::device_actor;
using multidev::device_error;
using multidev::device_key;
using multidev::event;
using multidev::task;
using multidev::task_spec;
using test_support::bounded;
using test_support::check_lost_chain;
using test_support::check_task_chain;
using test_support::contains;
using test_support::eventually;
using test_support::sync_error;
using test_support::watchdog;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

/// The test's kernels, registered in both processes (the same binary).
void register_test_kernels() {
  using k = multidev::arg_kind;
  multidev::register_kernel(
    "test_sleep_ms",
    {.params = {k::integer},
     .body = [](multidev::kernel_call& c) {
       std::this_thread::sleep_for(std::chrono::milliseconds(c.integer(0)));
     },
     .doc = "test_sleep_ms MS: holds the runner for MS milliseconds"});
  multidev::register_kernel(
    "test_stamp",
    {.params = {k::string},
     .body = [](multidev::kernel_call& c) {
       c.publish(c.string(0), 0, static_cast<uint64_t>(now_ns()), 1);
     },
     .doc = "test_stamp NAME: publishes when it ran (steady clock, ns) as NAME's hash"});
}

task_spec sleep_ms(int64_t ms) {
  return {"test_sleep_ms", {ms}};
}

task_spec stamp(const std::string& name) {
  return {"test_stamp", {name}};
}

/// An actor system with the middleman, two scheduler threads, work sharing.
std::unique_ptr<caf::actor_system> make_system(caf::actor_system_config& cfg) {
  cfg.load<caf::io::middleman>();
  multidev::register_types(cfg);
  cfg.set("scheduler.max-threads", size_t{2});
  cfg.set("scheduler.policy", caf::atom("sharing"));
  return std::make_unique<caf::actor_system>(cfg);
}

/// Publishes devices 0 and 1 of `a` on ephemeral loopback ports.
std::vector<uint16_t> publish_devices(caf::actor_system& sys, backend& a) {
  std::vector<uint16_t> ports;
  for (int i = 0; i < 2; ++i) {
    auto port =
      sys.middleman().publish(multidev::device_actor_of(a, a.get_device(i)), 0, "127.0.0.1");
    if (!port)
      throw std::runtime_error("publish failed: " + sys.render(port.error()));
    ports.push_back(*port);
  }
  return ports;
}

/// The device actor published on `port` of 127.0.0.1, attached to `b`.
device attach(caf::actor_system& sys, backend& b, uint16_t port) {
  auto a = bounded([&] { return sys.middleman().remote_actor<device_actor>("127.0.0.1", port); },
                   "remote_actor");
  if (!a)
    BOOST_FAIL("remote_actor on port " << port << ": " << sys.render(a.error()));
  return bounded([&] { return multidev::attach_device(b, *a); }, "attach_device");
}

// -- the scenario, run against either kind of peer ------------------------------

/// Who the remote devices are, as seen from `b`.
void check_identity(backend& b, const device& a0, const device& a1, const device& l0) {
  BOOST_TEST(!a0.is_local());
  BOOST_TEST(l0.is_local());
  BOOST_TEST(!a0.key().node.empty());
  BOOST_TEST(!(a0.key().node == l0.key().node)); // another actor system
  BOOST_TEST(a0.key().node == a1.key().node);
  BOOST_TEST(a0.key().device_id != a1.key().device_id);
  BOOST_TEST(b.get_name(a0) == a0.name());
  BOOST_TEST(contains(a0.name(), "multidev_cpu:0:"), a0.name());
  BOOST_TEST(a0.ordinal() == 0);
  BOOST_TEST(a1.ordinal() == 1);
  BOOST_TEST(a0.dev().driver == "cpu");
  // Attaching again gives the same device; its actor is the one we attached.
  auto again = bounded([&] { return multidev::attach_device(b, multidev::device_actor_of(b, a0)); },
                       "attach_device again");
  BOOST_TEST((again == a0));
  // A device record made on its runner shares its key and reaches it too
  // (and does not trouble b's destruction).
  auto twin = b.make_device(a0.dev(), a0.get_runner(), a0.ordinal());
  BOOST_TEST((twin.key() == a0.key()));
  BOOST_TEST(!twin.is_local());
  test_support::sync(b, b.schedule_named(twin, stamp("twin")));
  BOOST_TEST(b.result(a0, "twin").has_value());
  // One of b's own devices attaches as itself.
  auto own = bounded([&] { return multidev::attach_device(b, multidev::device_actor_of(b, l0)); },
                     "attach own device");
  BOOST_TEST((own == l0));
  auto printed = to_sexp(a0).to_string();
  BOOST_TEST(contains(printed, a0.key().node.str()), printed);
  auto info = bounded([&] { return b.get_debug_info(a0); }, "get_debug_info");
  BOOST_TEST(test_support::field_of(info, "node") == a0.key().node.str());
  BOOST_TEST(test_support::field_of(info, "device_id") == std::to_string(a0.device_id()));
  auto global = bounded([&] { return b.get_global_debug_info(); }, "get_global_debug_info");
  BOOST_TEST(contains(global.to_string(), "(attached"), global.to_string());
}

/// Pools, named kernels and results on a remote device.
void check_pools_and_kernels(backend& b, const device& a0) {
  constexpr std::size_t floats = 64;
  constexpr std::size_t bytes = floats * sizeof(float);
  // alloc_node places a node in a new pool of the remote device.
  multidev::tnode t{900, "remote_t", bytes, multidev::memory_mode::on_device};
  auto ctx = b.alloc_node(b.make_context(a0), t);
  auto loc = ctx.buffers.at(t);
  BOOST_TEST(bounded([&] { return b.get_used_memory(a0); }, "get_used_memory") >= bytes);
  buffer_arg buf{loc, bytes};
  b.memset_zero(a0, loc.pool_id, 0, bytes);
  b.schedule_named(a0, {"fill", {buf, 2.5}});
  auto sum = b.schedule_named(a0, {"checksum", {buf, std::string{"remote_sum"}}});
  test_support::sync(b, sum);
  BOOST_TEST(b.is_done(sum));
  auto r = bounded([&] { return b.result(a0, "remote_sum"); }, "result");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == 2.5 * floats);
  BOOST_TEST(r->count == floats);
  BOOST_TEST(!b.result(a0, "no_such_result").has_value());
  BOOST_TEST(!b.result("remote_sum").has_value()); // b's own board: not there
  // Bad input comes back as std::invalid_argument, naming what was wrong.
  try {
    b.memset_zero(a0, 4242, 0, 4);
    BOOST_ERROR("memset_zero accepted an unknown pool");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "4242"), e.what());
  }
  BOOST_CHECK_THROW(b.schedule_named(a0, {"no_such_kernel", {}}), std::invalid_argument);
  b.free_pool(a0, loc.pool_id);
  bounded([&] { b.await(a0); }, "await");
  BOOST_TEST(b.get_used_memory(a0) == 0u);
  BOOST_CHECK_THROW(b.free_pool(a0, loc.pool_id), std::invalid_argument); // double free
}

/// sync, is_done, all_work, is_idle and queue_length on a remote device.
void check_events(backend& b, const device& a0) {
  auto slow = b.schedule_named(a0, sleep_ms(300));
  BOOST_TEST(!b.is_done(slow)); // a round trip: the device is still sleeping
  BOOST_TEST(!slow.is_failed());
  BOOST_TEST(!b.is_idle(a0));
  BOOST_TEST(a0.get_runner().queue_length() >= 1u);
  auto all = b.all_work(a0);
  BOOST_TEST(all.seq() >= slow.seq());
  test_support::sync(b, all);
  BOOST_TEST(b.is_done(slow));
  BOOST_TEST(eventually([&] { return b.is_idle(a0); }));
  BOOST_TEST(a0.get_runner().queue_length() == 0u);
  // Printing makes no round trip; a done event prints done.
  auto printed = to_sexp(slow).to_string();
  BOOST_TEST(contains(printed, "(device " + a0.name() + ")"), printed);
  BOOST_TEST(contains(printed, "(seq " + std::to_string(slow.seq()) + ")"), printed);
  BOOST_TEST(contains(printed, "(state done)"), printed);
  std::ostringstream os;
  os << slow;
  BOOST_TEST(os.str() == printed);
  // The runner trace comes by message too (the peer traces 64 items).
  auto t = bounded([&] { return b.trace(a0); }, "trace");
  BOOST_TEST(t.device == a0.name());
  BOOST_TEST(t.capacity == 64u);
  BOOST_TEST_REQUIRE(!t.records.empty());
  auto& last = t.records.back();
  BOOST_TEST(last.seq == slow.seq());
  BOOST_TEST(contains(last.description, "test_sleep_ms"), last.description);
  BOOST_TEST(last.end_ns - last.start_ns >= 250'000'000);
}

/// An event is a value: it compares, hashes and serializes by (key, seq),
/// and a deserialized one reaches its device.
void check_event_values(backend& b, const device& a0, const device& l0) {
  auto e = b.schedule_named(a0, stamp("value"));
  test_support::sync(b, e);
  std::vector<char> buf;
  {
    caf::binary_serializer sink{nullptr, buf};
    auto err = sink(e);
    BOOST_TEST_REQUIRE(!err);
  }
  event back;
  {
    caf::binary_deserializer source{nullptr, buf};
    auto err = source(back);
    BOOST_TEST_REQUIRE(!err);
  }
  BOOST_TEST((back == e));
  BOOST_TEST((back.key() == a0.key()));
  BOOST_TEST(std::hash<event>{}(back) == std::hash<event>{}(e));
  BOOST_TEST(back.device_name() == a0.name());
  BOOST_TEST(back.is_done());
  auto next = b.schedule_named(a0, stamp("value2"));
  BOOST_TEST((e < next));
  BOOST_TEST((e != next));
  std::unordered_set<event> set{e, back, next};
  BOOST_TEST(set.size() == 2u);
  // A local event differs from a remote one of the same seq.
  auto local = event{l0.get_runner(), e.seq()};
  BOOST_TEST((local != e));
  // A key nobody here knows: prints and compares, refuses to be waited on.
  event stranger{device_key{multidev::node_ref{"nowhere#1"}, 7}, 3};
  BOOST_TEST(contains(to_sexp(stranger).to_string(), "(state unknown)"));
  BOOST_TEST(contains(to_sexp(stranger).to_string(), "(node nowhere#1)"));
  BOOST_CHECK_THROW(stranger.is_done(), std::invalid_argument);
  BOOST_CHECK_THROW(b.will_wait_for(b.make_context(l0), stranger), std::invalid_argument);
  test_support::sync(b, next);
}

/// will_wait_for in all four directions, each checked by the order in which
/// the work ran.
void check_waits(backend& b, const device& a0, const device& a1, const device& l0,
                 const device& l1) {
  // Local on local (the fast path).
  {
    auto release = std::make_shared<std::promise<void>>();
    b.schedule_task(l0, test_support::blocker(release->get_future().share()));
    auto held = b.all_work(l0);
    b.will_wait_for(b.make_context(l1), held);
    std::atomic<int> saw{-1};
    b.schedule_task(l1, {"after l0", [&] { saw = held.is_done() ? 1 : 0; }});
    std::this_thread::sleep_for(50ms);
    BOOST_TEST(saw.load() == -1);
    release->set_value();
    test_support::sync(b, b.all_work(l1));
    BOOST_TEST(saw.load() == 1);
  }
  // Local on remote: a gate on l0 that the reply to a `wait` opens.
  {
    auto held = b.schedule_named(a0, sleep_ms(300));
    b.will_wait_for(b.make_context(l0), held);
    std::atomic<int> saw{-1};
    b.schedule_task(l0, {"after a0", [&] { saw = held.is_done() ? 1 : 0; }});
    test_support::sync(b, b.all_work(l0));
    BOOST_TEST(saw.load() == 1);
    BOOST_TEST(b.is_done(held));
  }
  // Remote on local: a `depend` message; a0 asks l0's actor for the seq.
  {
    auto release = std::make_shared<std::promise<void>>();
    auto open = release->get_future().share();
    auto local_end = std::make_shared<std::atomic<int64_t>>(0);
    b.schedule_task(l0, {"hold l0", [open, local_end] {
                           if (open.wait_for(30s) != std::future_status::ready)
                             throw std::runtime_error("never released");
                           local_end->store(now_ns());
                         }});
    auto held = b.all_work(l0);
    b.will_wait_for(b.make_context(a0), held);
    auto after = b.schedule_named(a0, stamp("after_local"));
    std::this_thread::sleep_for(200ms);
    BOOST_TEST(!b.is_done(after)); // a0 waits for l0, which is held
    release->set_value();
    test_support::sync(b, after);
    auto r = b.result(a0, "after_local");
    BOOST_TEST_REQUIRE(r.has_value());
    BOOST_TEST(local_end->load() > 0);
    BOOST_TEST(static_cast<int64_t>(r->hash) >= local_end->load());
  }
  // Remote on remote: a1 waits for a0, both driven from here.
  {
    b.schedule_named(a0, sleep_ms(300));
    auto first = b.schedule_named(a0, stamp("a0_first"));
    b.will_wait_for(b.make_context(a1), first);
    auto second = b.schedule_named(a1, stamp("a1_second"));
    test_support::sync(b, second);
    // This process never waited on `first` (a1 did): is_done says what this
    // process knows, never waiting, and asking starts learning it.
    BOOST_TEST(eventually([&] { return b.is_done(first); }));
    auto r0 = b.result(a0, "a0_first");
    auto r1 = b.result(a1, "a1_second");
    BOOST_TEST_REQUIRE((r0 && r1));
    BOOST_TEST(r1->hash >= r0->hash);
  }
  // Waiting on a done event or on the device itself is a no-op.
  {
    auto done = b.all_work(a0);
    test_support::sync(b, done);
    b.will_wait_for(b.make_context(l1), done);
    b.will_wait_for(b.make_context(a0), done);
    auto after = b.schedule_named(a0, stamp("noop"));
    test_support::sync(b, after);
  }
}

/// What needs a closure on the device's runner refuses a remote device,
/// saying so; transfers move the bytes in messages, in both directions;
/// calls that may wait behind a full remote queue refuse a runner.
void check_refusals(backend& b, const device& a0, const device& l0) {
  auto says_remote = [&](const std::invalid_argument& e) {
    return contains(e.what(), a0.name()) && contains(e.what(), "another process");
  };
  BOOST_CHECK_EXCEPTION(b.schedule_task(a0, {"closure", [] {}}), std::invalid_argument,
                        says_remote);
  multidev::tnode t{901, "moved", 16, multidev::memory_mode::on_device};
  auto ctx = b.alloc_node(b.make_context(a0), t);
  BOOST_CHECK_EXCEPTION(b.link(ctx, "fill", {t, 1.0}), std::invalid_argument, says_remote);
  // host -> remote -> host, remote -> local, local -> remote: the bytes as sent.
  std::vector<std::byte> host(16), back(16), local_back(16), again(16);
  for (std::size_t i = 0; i < host.size(); ++i)
    host[i] = static_cast<std::byte>(i * 7 + 3);
  BOOST_TEST(b.from_host(ctx, t, host));
  BOOST_TEST(b.to_host(ctx, t, back));
  BOOST_TEST((back == host));
  auto lctx = b.alloc_node(b.make_context(l0), t);
  BOOST_TEST(b.device_to_device(t, multidev::merge_buffer_use::no, lctx, ctx).has_value());
  BOOST_TEST(b.to_host(lctx, t, local_back));
  b.sync(b.all_work(l0));
  BOOST_TEST((local_back == host));
  auto fresh = b.init_from_device(t, b.make_context(a0), lctx);
  BOOST_TEST(b.to_host(fresh, t, again));
  BOOST_TEST((again == host));
  auto init = b.init_from_host(b.make_context(a0), t, host);
  BOOST_TEST(init.buffers.contains(t));
  // From a task: schedule_named on a remote device refuses (deadlock_error);
  // will_wait_for on a remote context still works, as it never waits: here
  // a0 waits for the very task that asks (l0's event is not done yet).
  std::atomic<int> refused{0};
  auto task_end = std::make_shared<std::atomic<int64_t>>(0);
  b.schedule_task(l0, {"from a task", [&b, &a0, &l0, &refused, task_end] {
                         try {
                           b.schedule_named(a0, stamp("from_task"));
                         } catch (const multidev::deadlock_error&) {
                           refused = 1;
                         }
                         b.will_wait_for(b.make_context(a0), b.all_work(l0));
                         std::this_thread::sleep_for(100ms);
                         task_end->store(now_ns());
                       }});
  test_support::sync(b, b.all_work(l0));
  BOOST_TEST(refused.load() == 1);
  auto after = b.schedule_named(a0, stamp("after_task"));
  test_support::sync(b, after);
  auto r = b.result(a0, "after_task");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(static_cast<int64_t>(r->hash) >= task_end->load());
  b.free_pool(a0, ctx.buffers.at(t).pool_id);
}

/// cancel on a remote device drops its queued work as cancelled (sync throws
/// cancelled_error here too) and leaves it usable.
void check_cancel(backend& b, const device& a0) {
  b.schedule_named(a0, sleep_ms(300));
  auto c1 = b.schedule_named(a0, stamp("cancelled_1"));
  auto c2 = b.schedule_named(a0, stamp("cancelled_2"));
  b.cancel(a0);
  BOOST_CHECK_THROW(test_support::sync(b, c2), multidev::cancelled_error);
  // Learned without waiting (state never blocks): pending until the answer
  // to the question the first call sent is here.
  BOOST_TEST(eventually([&] { return b.state(c1) == multidev::event_state::cancelled; }));
  BOOST_TEST(c1.is_failed()); // it never will be done
  BOOST_TEST(!b.is_done(c1));
  BOOST_TEST(!b.result(a0, "cancelled_1").has_value());
  auto after = b.schedule_named(a0, stamp("after_cancel"));
  test_support::sync(b, after);
  BOOST_TEST((b.state(after) == multidev::event_state::done));
  BOOST_TEST(b.result(a0, "after_cancel").has_value());
}

/// A task failing on a remote device: device_error on this side with the
/// failure's provenance (origin device, task, message); a local device
/// waiting on it fails too, its path starting with that wait; recover
/// brings the remote device back.
void check_failure(backend& b, const device& a1, const device& l1) {
  auto bad = b.schedule_named(a1, {"fail", {std::string{"remote boom"}}});
  try {
    test_support::sync(b, bad);
    BOOST_ERROR("sync on a failed remote event returned");
  } catch (const device_error& e) {
    BOOST_TEST(e.device_name() == a1.name(), e.what());
    BOOST_TEST(contains(e.what(), "remote boom"), e.what());
    BOOST_TEST(e.origin_device() == a1.name());
    BOOST_TEST(contains(e.origin_task(), "fail"), e.origin_task());
    BOOST_TEST(e.original_message() == "remote boom");
  }
  BOOST_TEST(bad.is_failed());
  BOOST_TEST(!b.is_done(bad));
  BOOST_TEST((b.state(bad) == multidev::event_state::failed));
  b.will_wait_for(b.make_context(l1), bad);
  try {
    // The gate may fail (and l1 with it) before this is scheduled, or after.
    b.schedule_task(l1, {"behind a failed remote event", [] {}});
    test_support::sync(b, b.all_work(l1));
    BOOST_ERROR("a local device waiting on a failed remote event did not fail");
  } catch (const device_error& e) {
    BOOST_TEST(e.device_name() == l1.name(), e.what());
    BOOST_TEST(contains(e.what(), "waited for " + a1.name()), e.what());
    BOOST_TEST(contains(e.what(), "remote boom"), e.what());
    BOOST_TEST(e.origin_device() == a1.name());
    BOOST_TEST(e.original_message() == "remote boom");
    BOOST_TEST_REQUIRE(e.path().size() == 1u);
    BOOST_TEST(e.path()[0].waiter == l1.name());
    BOOST_TEST(e.path()[0].device == a1.name());
    BOOST_TEST(e.path()[0].seq == bad.seq());
  }
  BOOST_CHECK_THROW(b.schedule_named(a1, stamp("after failure")), device_error);
  // Recovery: the failed event stays failed, new work runs.
  BOOST_TEST(b.recover(a1));
  BOOST_TEST(!b.recover(a1)); // not failed any more
  auto again = b.schedule_named(a1, stamp("recovered"));
  test_support::sync(b, again);
  BOOST_TEST((b.state(again) == multidev::event_state::done));
  BOOST_TEST((b.state(bad) == multidev::event_state::failed));
  BOOST_TEST(!b.is_done(bad));
}

/// Everything above, on `b` (devices l0, l1) against the remote a0, a1.
void drive(backend& b, const device& a0, const device& a1) {
  auto l0 = b.get_device(0);
  auto l1 = b.get_device(1);
  check_identity(b, a0, a1, l0);
  check_pools_and_kernels(b, a0);
  check_events(b, a0);
  check_event_values(b, a0, l0);
  check_waits(b, a0, a1, l0, l1);
  check_cancel(b, a0);
  check_refusals(b, a0, l0);
  check_failure(b, a1, l1);
}

// -- a second process -----------------------------------------------------------

/// This binary started again with `--serve-devices`: its stdin and stdout are
/// pipes. Killed (SIGKILL) and reaped when destroyed, if still running.
class peer_process {
public:
  peer_process() {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0)
      throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::string self = "/proc/self/exe";
    char arg0[] = "test_remote";
    char arg1[] = "--serve-devices";
    char* argv[] = {arg0, arg1, nullptr};
    int rc = posix_spawn(&pid_, self.c_str(), &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    if (rc != 0)
      throw std::runtime_error("posix_spawn failed");
  }
  peer_process(const peer_process&) = delete;
  peer_process& operator=(const peer_process&) = delete;
  ~peer_process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close_stdin();
    if (from_child_ >= 0)
      close(from_child_);
  }

  /// The next line the peer writes, waiting at most `limit`.
  std::string read_line(std::chrono::seconds limit = test_support::hang_limit) {
    std::string line;
    auto deadline = std::chrono::steady_clock::now() + limit;
    char c;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
      pollfd p{from_child_, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0)
        throw std::runtime_error("the peer process wrote no line in time");
      if (read(from_child_, &c, 1) != 1)
        throw std::runtime_error("the peer process closed its output");
      if (c == '\n')
        return line;
      line.push_back(c);
    }
  }

  /// Asks the peer to quit (it quits when its stdin closes) and returns its
  /// exit status, waiting at most `limit`; -1 if it had to be killed.
  int finish(std::chrono::seconds limit = test_support::hang_limit) {
    close_stdin();
    int status = 0;
    bool reaped = eventually([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, limit);
    if (!reaped)
      return -1; // the destructor kills it
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  /// Kills the peer now (SIGKILL), as a node that vanishes.
  void kill_now() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

private:
  void close_stdin() {
    if (to_child_ >= 0) {
      close(to_child_);
      to_child_ = -1;
    }
  }

  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
};

/// The peer's side: publishes two devices, prints `ports P0 P1`, serves
/// until its stdin closes (at most two minutes), then shuts down cleanly.
int serve_devices() {
  caf::actor_system_config cfg;
  auto sys = make_system(cfg);
  {
    backend a{*sys, backend_options{.num_devices = 2, .trace_capacity = 64}};
    auto ports = publish_devices(*sys, a);
    std::printf("ports %u %u\n", static_cast<unsigned>(ports[0]),
                static_cast<unsigned>(ports[1]));
    std::fflush(stdout);
    pollfd p{0, POLLIN, 0};
    auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    char c;
    while (std::chrono::steady_clock::now() < deadline) {
      if (poll(&p, 1, 1000) > 0 && read(0, &c, 1) <= 0)
        break; // stdin closed: the test is done with us
    }
  }
  sys.reset();
  return 0;
}

/// Two actor systems in this process: A's backend `a` (two devices) serves
/// them on `ports`; B's backend `b` has one local device. Both systems are
/// shut down under a watchdog, b first.
struct node_a_serves_b {
  ~node_a_serves_b() {
    watchdog guard{"shutting down both systems"};
    b.reset();
    sys_b.reset();
    a.reset();
    sys_a.reset();
  }

  caf::actor_system_config cfg_a;
  std::unique_ptr<caf::actor_system> sys_a = make_system(cfg_a);
  std::unique_ptr<backend> a = std::make_unique<backend>(*sys_a, backend_options{.num_devices = 2});
  std::vector<uint16_t> ports = publish_devices(*sys_a, *a);
  caf::actor_system_config cfg_b;
  std::unique_ptr<caf::actor_system> sys_b = make_system(cfg_b);
  std::unique_ptr<backend> b = std::make_unique<backend>(*sys_b, backend_options{.num_devices = 1});
};

} // namespace

// -- the tests ------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_remote_devices_of_a_second_actor_system_in_this_process) {
  caf::actor_system_config cfg_a;
  auto sys_a = make_system(cfg_a);
  auto a = std::make_unique<backend>(
    *sys_a, backend_options{.num_devices = 2, .trace_capacity = 64});
  auto ports = publish_devices(*sys_a, *a);
  caf::actor_system_config cfg_b;
  auto sys_b = make_system(cfg_b);
  auto b = std::make_unique<backend>(*sys_b, backend_options{.num_devices = 2});
  {
    watchdog guard{"the remote scenario (second actor system)"};
    auto a0 = attach(*sys_b, *b, ports[0]);
    auto a1 = attach(*sys_b, *b, ports[1]);
    BOOST_TEST((a0.key() == a->get_device(0).key())); // the key names the device everywhere
    drive(*b, a0, a1);
    // An event of A's device deserialized here resolves to A's own endpoint
    // (this process has its core), not to b's attachment of it.
    event remote_view = b->all_work(a0);
    std::vector<char> buf;
    caf::binary_serializer sink{nullptr, buf};
    BOOST_TEST_REQUIRE(!sink(remote_view));
    event back;
    caf::binary_deserializer source{nullptr, buf};
    BOOST_TEST_REQUIRE(!source(back));
    BOOST_TEST((back == remote_view));
    BOOST_TEST(back.is_local());
  }
  {
    watchdog guard{"shutting down both systems"};
    b.reset();
    sys_b.reset();
    a.reset();
    sys_a.reset();
  }
}

BOOST_FIXTURE_TEST_CASE(test_remote_a_deadline_names_a_wait_on_another_node, node_a_serves_b) {
  // A's device a0 runs a long task; B's local device waits on it. A deadline
  // on B's side names the chain across the node, followed into A (issue 37
  // point 6: it stopped at the process edge, "lives on another node and has
  // not reported it done"), and the wait graph shows it.
  {
    watchdog guard{"a deadline on a wait across nodes"};
    auto a0 = attach(*sys_b, *b, ports[0]);
    auto slow = b->schedule_named(a0, sleep_ms(400));
    auto l0 = b->get_device(0);
    b->will_wait_for(b->make_context(l0), slow);
    b->schedule_task(l0, task{"behind the remote task", [] {}});
    auto local = b->all_work(l0);
    try {
      b->sync(local, 20ms);
      BOOST_ERROR("a sync with a deadline returned before the remote task ended");
    } catch (const multidev::timeout_error& e) {
      auto chain = l0.name() + " waits on event " + std::to_string(slow.seq()) + " of " +
                   a0.name() + ", which is running its seq " + std::to_string(slow.seq());
      BOOST_TEST(e.chain() == chain, e.what());
    }
    try {
      b->sync(slow, 20ms);
      BOOST_ERROR("a remote sync with a deadline returned before the task ended");
    } catch (const multidev::timeout_error& e) {
      BOOST_TEST(contains(e.what(), "sync on " + a0.name()), e.what());
      BOOST_TEST(e.chain() == a0.name() + " is running its seq " + std::to_string(slow.seq()),
                 e.what());
    }
    auto graph = b->get_global_debug_info().find("wait_for")->to_string();
    BOOST_TEST(contains(graph, "(waiter " + l0.name() + ")"), graph);
    BOOST_TEST(contains(graph, "(event (device " + a0.name() + ") (seq " +
                                 std::to_string(slow.seq()) + ") (node remote)"),
               graph);
    bounded([&] { b->sync(local, 30s); }, "the sync once the remote task ended");
  }
}

BOOST_FIXTURE_TEST_CASE(test_remote_a_timed_out_sync_leaves_no_wait_on_the_device, node_a_serves_b) {
  // A's device 0 is held; B syncs 200 times on a pending event of it, each
  // with a 1 ms deadline. Each gives up at its deadline and tells the device
  // (issue 36 point 2): no wait stays registered there until the event
  // resolves. Once released, a sync without a deadline still completes.
  {
    watchdog guard{"timed-out syncs on a device of another node"};
    auto a0 = attach(*sys_b, *b, ports[0]);
    auto release = test_support::block_runner(*a, a->get_device(0));
    auto pending = b->schedule_named(a0, sleep_ms(0));
    BOOST_TEST_REQUIRE(test_support::field_of(b->get_debug_info(a0), "waiters") == "0");
    constexpr int tries = 200;
    int timed_out = 0;
    for (int i = 0; i < tries; ++i) {
      try {
        if (i % 2 == 0)
          b->sync(pending, 1ms);
        else
          b->await(a0, 1ms);
      } catch (const multidev::timeout_error&) {
        ++timed_out;
      }
    }
    BOOST_TEST(timed_out == tries);
    // Through the same link as the syncs' cancellations: after them.
    auto info = b->get_debug_info(a0);
    BOOST_TEST(test_support::field_of(info, "waiters") == "0", info.to_string());
    release->open();
    bounded([&] { b->sync(pending); }, "the sync once the remote device was released");
    BOOST_TEST(pending.is_done());
    BOOST_TEST(test_support::field_of(b->get_debug_info(a0), "waiters") == "0");
  }
}

BOOST_AUTO_TEST_CASE(test_remote_devices_of_another_process) {
  peer_process peer;
  std::istringstream line{peer.read_line()};
  std::string word;
  unsigned p0 = 0, p1 = 0;
  line >> word >> p0 >> p1;
  BOOST_TEST_REQUIRE(word == "ports");
  caf::actor_system_config cfg;
  auto sys = make_system(cfg);
  auto b = std::make_unique<backend>(*sys, backend_options{.num_devices = 2});
  {
    watchdog guard{"the remote scenario (second process)"};
    auto a0 = attach(*sys, *b, static_cast<uint16_t>(p0));
    auto a1 = attach(*sys, *b, static_cast<uint16_t>(p1));
    drive(*b, a0, a1);

    // The peer process vanishes: a pending wait on its device and a local
    // device waiting on it end in errors, no call hangs.
    auto l0 = b->get_device(0);
    auto doomed = b->schedule_named(a0, sleep_ms(20'000));
    b->will_wait_for(b->make_context(l0), doomed);
    b->schedule_task(l0, {"behind a vanished node", [] {}});
    peer.kill_now();
    try {
      test_support::sync(*b, doomed);
      BOOST_ERROR("sync on an event of a vanished node returned");
    } catch (const device_error& e) {
      BOOST_TEST(e.device_name() == a0.name(), e.what());
      BOOST_TEST(contains(e.what(), "down"), e.what());
    }
    try {
      test_support::sync(*b, b->all_work(l0));
      BOOST_ERROR("a local device waiting on a vanished node did not fail");
    } catch (const device_error& e) {
      BOOST_TEST(e.device_name() == l0.name(), e.what());
      BOOST_TEST(contains(e.what(), "waited for " + a0.name()), e.what());
    }
    BOOST_CHECK_THROW(b->schedule_named(a0, stamp("gone")), device_error);
    BOOST_TEST(doomed.is_failed());
    // Debug info lists the lost devices with the error, without throwing.
    auto global = b->get_global_debug_info().to_string();
    BOOST_TEST(contains(global, "(attached"), global);
    BOOST_TEST(contains(global, "(error"), global);
  }
  {
    watchdog guard{"shutting down"};
    b.reset();
    sys.reset();
  }
}

BOOST_AUTO_TEST_CASE(test_remote_peer_process_exits_cleanly) {
  peer_process peer;
  std::istringstream line{peer.read_line()};
  std::string word;
  line >> word;
  BOOST_TEST_REQUIRE(word == "ports");
  {
    caf::actor_system_config cfg;
    auto sys = make_system(cfg);
    {
      backend b{*sys, backend_options{.num_devices = 1}};
      unsigned p0 = 0;
      line >> p0;
      auto a0 = attach(*sys, b, static_cast<uint16_t>(p0));
      auto e = b.schedule_named(a0, stamp("clean"));
      test_support::sync(b, e);
      // b goes first, while a device of the peer may still wait on one of
      // b's devices: the peer exits cleanly all the same.
      auto l0 = b.get_device(0);
      auto release = std::make_shared<std::promise<void>>();
      b.schedule_task(l0, test_support::blocker(release->get_future().share()));
      b.will_wait_for(b.make_context(a0), b.all_work(l0));
      release->set_value();
    }
    watchdog guard{"shutting down"};
    sys.reset();
  }
  BOOST_TEST(peer.finish() == 0);
}

// -- provenance across processes ------------------------------------------------

BOOST_AUTO_TEST_CASE(test_remote_provenance_survives_three_hops_across_two_actor_systems) {
  // Two actor systems ("nodes" A and B), each serving its devices to the
  // other. A failure starts on A's a0 and travels B -> A -> B:
  // b1 waits for a1, which waits for b0, which waits for a0's failing task.
  caf::actor_system_config cfg_a;
  auto sys_a = make_system(cfg_a);
  auto a = std::make_unique<backend>(*sys_a, backend_options{.num_devices = 2});
  caf::actor_system_config cfg_b;
  auto sys_b = make_system(cfg_b);
  auto b = std::make_unique<backend>(*sys_b, backend_options{.num_devices = 2});
  auto ports_a = publish_devices(*sys_a, *a);
  auto ports_b = publish_devices(*sys_b, *b);
  {
    watchdog guard{"provenance through three hops on two actor systems"};
    auto a0 = attach(*sys_b, *b, ports_a[0]); // B's view of A's devices
    auto a1 = attach(*sys_b, *b, ports_a[1]);
    auto b0 = b->get_device(0);
    auto b1 = b->get_device(1);
    auto b0_at_a = attach(*sys_a, *a, ports_b[0]); // A's view of B's devices
    auto b1_at_a = attach(*sys_a, *a, ports_b[1]);
    std::unordered_set<std::string> names{a0.name(), a1.name(), b0.name(), b1.name()};
    BOOST_TEST_REQUIRE(names.size() == 4u);
    // a0 is held, so the whole chain is in place before its origin fails.
    auto release = std::make_shared<std::promise<void>>();
    a->schedule_task(a->get_device(0), test_support::blocker(release->get_future().share()));
    auto e0 = b->schedule_named(a0, {"fail", {std::string{"boom"}}});
    b->will_wait_for(b->make_context(b0), e0); // B on A: a `wait` request
    auto e1 = b->all_work(b0);
    b->will_wait_for(b->make_context(a1), e1); // A on B: a `depend` message
    auto e2 = b->all_work(a1);
    b->will_wait_for(b->make_context(b1), e2); // B on A again
    auto e3 = b->all_work(b1);
    BOOST_TEST(!b->is_done(e3));
    BOOST_TEST(!e3.is_failed());
    release->set_value();

    multidev::failure_hop b0_on_a0{b0.name(), a0.name(), e0.seq()};
    multidev::failure_hop a1_on_b0{a1.name(), b0.name(), e1.seq()};
    multidev::failure_hop b1_on_a1{b1.name(), a1.name(), e2.seq()};
    // The origin's task, as the failure at the origin describes it.
    auto origin = sync_error(*b, e0, "B: a0");
    BOOST_TEST_REQUIRE(origin.has_value());
    auto task = origin->origin_task();
    BOOST_TEST(contains(task, "fail"), task);
    BOOST_TEST_MESSAGE("origin: " << origin->what());
    check_task_chain(origin, a0.name(), task, e0.seq(), "boom", {}, "B: a0");

    // Seen from B: each event of the chain, one hop more each time.
    check_task_chain(sync_error(*b, e1, "B: b0"), a0.name(), task, e0.seq(), "boom",
                     {b0_on_a0}, "B: b0");
    check_task_chain(sync_error(*b, e2, "B: a1"), a0.name(), task, e0.seq(), "boom",
                     {a1_on_b0, b0_on_a0}, "B: a1");
    auto last = sync_error(*b, e3, "B: b1");
    check_task_chain(last, a0.name(), task, e0.seq(), "boom", {b1_on_a1, a1_on_b0, b0_on_a0},
                     "B: b1");
    BOOST_TEST_MESSAGE("end of the chain: " << (last ? last->what() : "none"));
    BOOST_TEST((b->state(e3) == multidev::event_state::failed));

    // Seen from A: a1's own event (its core is here), and B's events over
    // the wire.
    check_task_chain(sync_error(*a, event{a->get_device(1).get_runner(), e2.seq()}, "A: a1"),
                     a0.name(), task, e0.seq(), "boom", {a1_on_b0, b0_on_a0}, "A: a1");
    check_task_chain(sync_error(*a, event{b0_at_a.get_runner(), e1.seq()}, "A: b0"), a0.name(),
                     task, e0.seq(), "boom", {b0_on_a0}, "A: b0");
    check_task_chain(sync_error(*a, event{b1_at_a.get_runner(), e3.seq()}, "A: b1"), a0.name(),
                     task, e0.seq(), "boom", {b1_on_a1, a1_on_b0, b0_on_a0}, "A: b1");
  }
  {
    watchdog guard{"shutting down both systems"};
    b.reset();
    sys_b.reset();
    a.reset();
    sys_a.reset();
  }
}

BOOST_AUTO_TEST_CASE(test_remote_provenance_survives_the_loss_of_the_origin_process) {
  // Three nodes: the peer process P (devices p0, p1; killed), and two actor
  // systems here, B (devices l0, l1, driving everything) and C (c0..c2,
  // attached to B only). Two chains start on P:
  //   c1 waits for l0, which waits for c0, which waits for p0 -- C never
  //   connected to P: B routes c0's wait and tells c0 when P is lost;
  //   c2 waits for l1, which waits for p1 -- B's own wait on P.
  peer_process peer;
  std::istringstream line{peer.read_line()};
  std::string word;
  unsigned port0 = 0, port1 = 0;
  line >> word >> port0 >> port1;
  BOOST_TEST_REQUIRE(word == "ports");
  // Device names are `multidev_cpu:<ordinal>:<id>`, and the ids of two
  // systems may coincide: the devices used here have ordinals of their own
  // (P: 0 and 1; B: 2 and 3; C: 4 to 6), so every name says which it is.
  caf::actor_system_config cfg_b;
  auto sys_b = make_system(cfg_b);
  auto b = std::make_unique<backend>(*sys_b, backend_options{.num_devices = 4});
  caf::actor_system_config cfg_c;
  auto sys_c = make_system(cfg_c);
  auto c = std::make_unique<backend>(*sys_c, backend_options{.num_devices = 7});
  std::vector<uint16_t> ports_c;
  for (int i = 4; i < 7; ++i) {
    auto port = sys_c->middleman().publish(multidev::device_actor_of(*c, c->get_device(i)), 0,
                                           "127.0.0.1");
    BOOST_TEST_REQUIRE(static_cast<bool>(port));
    ports_c.push_back(*port);
  }
  {
    watchdog guard{"provenance of a chain whose origin process is lost"};
    auto p0 = attach(*sys_b, *b, static_cast<uint16_t>(port0));
    auto p1 = attach(*sys_b, *b, static_cast<uint16_t>(port1));
    auto c0 = attach(*sys_b, *b, ports_c[0]);
    auto c1 = attach(*sys_b, *b, ports_c[1]);
    auto c2 = attach(*sys_b, *b, ports_c[2]);
    auto l0 = b->get_device(2);
    auto l1 = b->get_device(3);
    std::unordered_set<std::string> names{p0.name(), p1.name(), c0.name(), c1.name(),
                                          c2.name(), l0.name(), l1.name()};
    BOOST_TEST_REQUIRE(names.size() == 7u, "device names collide across the processes: "
                                             << p0.name() << " " << p1.name() << " "
                                             << c0.name() << " " << c1.name() << " "
                                             << c2.name() << " " << l0.name() << " "
                                             << l1.name());
    auto doomed0 = b->schedule_named(p0, sleep_ms(20'000));
    auto doomed1 = b->schedule_named(p1, sleep_ms(20'000));
    b->will_wait_for(b->make_context(c0), doomed0); // C on P, through B
    auto x1 = b->all_work(c0);
    b->will_wait_for(b->make_context(l0), x1); // B on C
    auto x2 = b->all_work(l0);
    b->will_wait_for(b->make_context(c1), x2); // C on B
    auto x3 = b->all_work(c1);
    b->will_wait_for(b->make_context(l1), doomed1); // B on P
    auto y1 = b->all_work(l1);
    b->will_wait_for(b->make_context(c2), y1); // C on B
    auto y2 = b->all_work(c2);
    BOOST_TEST(!b->is_done(x3));
    BOOST_TEST(!b->is_done(y2));
    peer.kill_now();

    multidev::failure_hop c0_on_p0{c0.name(), p0.name(), doomed0.seq()};
    multidev::failure_hop l0_on_c0{l0.name(), c0.name(), x1.seq()};
    multidev::failure_hop c1_on_l0{c1.name(), l0.name(), x2.seq()};
    multidev::failure_hop l1_on_p1{l1.name(), p1.name(), doomed1.seq()};
    multidev::failure_hop c2_on_l1{c2.name(), l1.name(), y1.seq()};

    // Seen from B.
    check_lost_chain(sync_error(*b, doomed0, "B: p0"), p0.name(), {}, "B: p0");
    check_lost_chain(sync_error(*b, x1, "B: c0"), p0.name(), {c0_on_p0}, "B: c0");
    check_lost_chain(sync_error(*b, x2, "B: l0"), p0.name(), {l0_on_c0, c0_on_p0}, "B: l0");
    auto last = sync_error(*b, x3, "B: c1");
    check_lost_chain(last, p0.name(), {c1_on_l0, l0_on_c0, c0_on_p0}, "B: c1");
    BOOST_TEST_MESSAGE("end of the chain through C: " << (last ? last->what() : "none"));
    check_lost_chain(sync_error(*b, y1, "B: l1"), p1.name(), {l1_on_p1}, "B: l1");
    auto last_y = sync_error(*b, y2, "B: c2");
    check_lost_chain(last_y, p1.name(), {c2_on_l1, l1_on_p1}, "B: c2");
    BOOST_TEST_MESSAGE("end of the chain through B: " << (last_y ? last_y->what() : "none"));

    // Seen from C, where c0..c2's cores are.
    auto at_c = [&](int i, uint64_t seq) {
      return event{c->get_device(4 + i).get_runner(), seq};
    };
    check_lost_chain(sync_error(*c, at_c(0, x1.seq()), "C: c0"), p0.name(), {c0_on_p0}, "C: c0");
    check_lost_chain(sync_error(*c, at_c(1, x3.seq()), "C: c1"), p0.name(),
                     {c1_on_l0, l0_on_c0, c0_on_p0}, "C: c1");
    check_lost_chain(sync_error(*c, at_c(2, y2.seq()), "C: c2"), p1.name(), {c2_on_l1, l1_on_p1},
                     "C: c2");
  }
  {
    watchdog guard{"shutting down both systems"};
    b.reset();
    sys_b.reset();
    c.reset();
    sys_c.reset();
  }
}

int main(int argc, char* argv[]) {
  register_test_kernels();
  if (argc >= 2 && std::string_view{argv[1]} == "--serve-devices")
    return serve_devices();
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
