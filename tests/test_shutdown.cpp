// Shutdown (SPEC §5.8): destroying a backend finishes the work it accepted,
// joins its runners, frees its pools and stops its actors, whether it owns its
// actor system or runs on one the program owns; handles that outlive it do not
// keep anything alive that would stop the program from exiting.
#define BOOST_TEST_MODULE shutdown
#include <boost/test/unit_test.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/logger.hpp>
#include <caf/send.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "actors/core/device_core.hpp" // white box: pool memory after shutdown
#include "actors/remote/reply_sink.hpp"  // white box: a sink that dies in its own reply
#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using multidev::backend;
using multidev::backend_options;
using test_support::bounded;
using test_support::eventually;
using test_support::latch_gate;

namespace {

/// Threads of this process right now. Under ThreadSanitizer the runtime adds
/// a background thread of its own at the first pthread_create and keeps it
/// for good: one thread started and joined before the first count makes it
/// part of every baseline (and changes nothing without TSan).
std::size_t thread_count() {
  static const bool runtime_threads_started = [] {
    std::thread{[] {}}.join();
    return true;
  }();
  (void)runtime_threads_started;
  std::size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

/// `cfg` made ready for an actor system the program owns: multidev's types,
/// two scheduler threads.
caf::actor_system_config& program_config(caf::actor_system_config& cfg) {
  multidev::register_types(cfg);
  cfg.set("scheduler.max-threads", std::size_t{2});
  return cfg;
}

} // namespace

BOOST_AUTO_TEST_CASE(test_shutdown_destroying_backend_finishes_queued_work) {
  constexpr int total = 10000;
  auto baseline = thread_count();
  std::atomic<int> counter{0};
  std::vector<multidev::event> events;
  multidev::device kept;
  auto hold = std::make_shared<latch_gate>();
  auto b = std::make_unique<backend>(backend_options{.num_devices = 2});
  auto d0 = b->get_device(0), d1 = b->get_device(1);
  kept = d0;
  b->alloc_pool(d0, 1, 4096, 64);
  // d0 is held until destruction has begun, so its work is still queued then.
  b->schedule_task(d0, {"hold", [hold] { hold->wait(); }});
  for (int i = 0; i < total; ++i) {
    auto& d = i % 2 ? d1 : d0;
    b->schedule_task(d, {"inc", [&counter] { ++counter; }});
    if (i % 1000 == 999)
      events.push_back(b->all_work(d));
  }
  // d1's tail also waits for all of d0's work.
  b->will_wait_for(b->make_context(d1), b->all_work(d0));
  std::atomic<int> tail_saw{-1};
  b->schedule_task(d1, {"tail", [&] { tail_saw = counter.load(); }});
  events.push_back(b->all_work(d1));
  BOOST_TEST(!events.back().is_done()); // d0 is held: the tail cannot be done
  auto opener = std::async(std::launch::async, [hold] {
    std::this_thread::sleep_for(100ms);
    hold->open();
  });
  bounded([&] { b.reset(); });
  opener.get();
  BOOST_TEST(counter.load() == total);
  BOOST_TEST(tail_saw.load() == total); // the wait held through shutdown
  for (auto& e : events) {
    BOOST_TEST(e.is_done());
    BOOST_TEST(!e.is_failed());
  }
  bounded([&] {
    auto c = kept.get_runner().core();
    c->events().sync(c->queue().scheduled());
  });
  BOOST_TEST(kept.get_runner().queue_length() == 0u);
  BOOST_TEST(kept.get_runner().core()->pools().used_memory() == 0u); // pools freed
  // Runners and the backend's own actor system threads are gone.
  BOOST_TEST(eventually([&] { return thread_count() <= baseline; }),
             "threads: " << thread_count() << ", before the backend: " << baseline);
}

BOOST_AUTO_TEST_CASE(test_shutdown_events_obtained_earlier_are_done_after_destruction) {
  std::vector<multidev::event> events;
  std::vector<int> order;
  std::mutex mu;
  {
    backend b{backend_options{.num_devices = 3}};
    std::vector<multidev::device> devs{b.get_device(0), b.get_device(1), b.get_device(2)};
    for (int round = 0; round < 20; ++round)
      for (int k = 0; k < 3; ++k) {
        auto& d = devs[static_cast<std::size_t>(k)];
        // A chain: each device waits for the previous one's last event.
        if (!events.empty())
          b.will_wait_for(b.make_context(d), events.back());
        int tag = round * 3 + k;
        b.schedule_task(d, {"step", [&, tag] {
                              std::this_thread::sleep_for(50us);
                              std::lock_guard g{mu};
                              order.push_back(tag);
                            }});
        events.push_back(b.all_work(d));
      }
  } // destroyed with the chain (most likely) still running
  for (auto& e : events) {
    BOOST_TEST(e.is_done());
    BOOST_TEST(!e.is_failed());
    e.sync(); // returns at once, no throw
  }
  BOOST_TEST_REQUIRE(order.size() == 60u);
  for (int i = 0; i < 60; ++i)
    BOOST_TEST(order[static_cast<std::size_t>(i)] == i);
}

BOOST_AUTO_TEST_CASE(test_shutdown_backend_on_user_owned_actor_system) {
  // The program's own thread owns the actor system and the backend; the test
  // thread drives the devices (and stays alive throughout): destroying the
  // backend and then the system on the owner thread must not hang.
  auto baseline = thread_count();
  std::atomic<int> counter{0};
  multidev::device kept;
  multidev::event last;
  std::promise<backend*> ready;
  auto drive_done = std::make_shared<latch_gate>();
  std::atomic<std::size_t> actors_during{0}, actors_before{0}, actors_after{0};
  auto owner = std::async(std::launch::async, [&] {
    caf::actor_system_config cfg;
    auto sys = std::make_unique<caf::actor_system>(program_config(cfg));
    actors_before = sys->registry().running();
    {
      backend b{*sys, backend_options{.num_devices = 2}};
      ready.set_value(&b);
      if (!drive_done->wait())
        return false;
      actors_during = sys->registry().running();
    } // the backend goes first ...
    eventually([&] { return sys->registry().running() <= actors_before; });
    actors_after = sys->registry().running();
    sys.reset(); // ... then the system, which waits for every actor
    return true;
  });
  auto ready_fut = ready.get_future();
  BOOST_REQUIRE(ready_fut.wait_for(30s) == std::future_status::ready);
  backend& b = *ready_fut.get();
  auto d0 = b.get_device(0), d1 = b.get_device(1); // spawns the device actors
  kept = d1;
  b.alloc_pool(d0, 1, 1024, 64); // asks d0's actor
  b.memset_zero(d0, 1, 0, 1024);
  for (int i = 0; i < 1000; ++i)
    b.schedule_task(i % 2 ? d1 : d0, {"inc", [&counter] { ++counter; }});
  b.will_wait_for(b.make_context(d1), b.all_work(d0));
  b.schedule_task(d1, {"tail", [] { std::this_thread::sleep_for(20ms); }});
  last = b.all_work(d1);
  drive_done->open();
  auto finished = owner.wait_for(30s) == std::future_status::ready;
  if (!finished)
    new decltype(owner)(std::move(owner)); // leak the stuck owner thread
  BOOST_REQUIRE_MESSAGE(finished, "the backend or its actor system did not shut down");
  BOOST_TEST(owner.get());
  BOOST_TEST(actors_during.load() > actors_before.load()); // device actors ran
  BOOST_TEST(actors_after.load() <= actors_before.load()); // and terminated
  BOOST_TEST(counter.load() == 1000);
  BOOST_TEST(last.is_done());
  // The kept handle is still readable, and holds nothing that runs.
  BOOST_TEST(kept.ordinal() == 1);
  BOOST_TEST(kept.name().rfind("multidev_cpu:1:", 0) == 0u);
  BOOST_TEST(kept.get_runner().queue_length() == 0u);
  BOOST_TEST(eventually([&] { return thread_count() <= baseline; }),
             "threads: " << thread_count() << ", before: " << baseline);
}

BOOST_AUTO_TEST_CASE(test_shutdown_backend_destroyed_on_another_thread) {
  // Built and driven on this thread, destroyed on another one while this one
  // lives on.
  std::atomic<int> n{0};
  auto b = std::make_unique<backend>(backend_options{.num_devices = 2});
  auto d = b->get_device(0);
  b->alloc_pool(d, 1, 64, 64);
  b->free_pool(d, 1);
  for (int i = 0; i < 100; ++i)
    b->schedule_task(b->get_device(i % 2), {"inc", [&n] { ++n; }});
  bounded([&] { b.reset(); });
  BOOST_TEST(n.load() == 100);
}

BOOST_AUTO_TEST_CASE(test_shutdown_kept_device_handle_does_not_block_exit) {
  // Own actor system: its destructor waits for every actor, so a device handle
  // that kept its actor alive would hang here.
  multidev::device kept;
  std::atomic<bool> ran{false};
  bounded([&] {
    backend b{backend_options{.num_devices = 1}};
    kept = b.get_device(0);
    b.alloc_pool(kept, 0, 256, 64);
    b.schedule_task(kept, {"t", [&] { ran = true; }});
  });
  BOOST_TEST(ran.load());
  BOOST_TEST(static_cast<bool>(kept));
  BOOST_TEST(kept.get_runner().core()->pools().used_memory() == 0u); // pools freed
  BOOST_TEST(!kept.merge_buffer());
  // Work offered to a device whose backend is gone is refused, not lost.
  backend other{backend_options{.num_devices = 1}};
  BOOST_CHECK_THROW(other.schedule_task(kept, {"late", [] {}}), multidev::device_error);
  BOOST_CHECK_THROW(other.alloc_pool(kept, 1, 64, 64), std::invalid_argument);

  // The same on a user-owned system: the system's destructor must return.
  multidev::device kept2;
  bounded([&] {
    caf::actor_system_config cfg;
    caf::actor_system sys{program_config(cfg)};
    {
      backend b{sys, backend_options{.num_devices = 2}};
      kept2 = b.get_device(1);
      b.schedule_task(kept2, {"t", [] {}});
    }
  });
  BOOST_TEST(kept2.get_runner().queue_length() == 0u);
}

BOOST_AUTO_TEST_CASE(test_shutdown_many_backends_in_sequence_leak_no_threads) {
  auto baseline = thread_count();
  for (int i = 0; i < 20; ++i) {
    std::atomic<int> n{0};
    bounded([&] {
      backend b{backend_options{.num_devices = 4}};
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 50; ++j)
          b.schedule_task(b.get_device(k), {"inc", [&n] { ++n; }});
    });
    BOOST_TEST_REQUIRE(n.load() == 200);
  }
  BOOST_TEST(eventually([&] { return thread_count() <= baseline; }),
             "threads: " << thread_count() << ", before: " << baseline);
}

BOOST_AUTO_TEST_CASE(test_shutdown_reply_sink_may_die_inside_its_own_reply) {
  // A reply sink runs a reply's handler inside its companion's enqueue,
  // under the companion's lock, holding the sink. When the sink's last other
  // owner lets go meanwhile, the sink is destroyed right there, and ending
  // its companion took that lock again: the delivering thread spun forever
  // (seen under ThreadSanitizer as a hung test_hardening).
  std::optional<caf::actor_system> sys;
  {
    caf::actor_system_config cfg;
    sys.emplace(program_config(cfg));
  }
  // An argument, though unused: CAF 0.17 spawns a function without one
  // through a null tuple pointer, which UBSan reports (`sanitize` preset).
  auto target = sys->spawn(
    [](caf::event_based_actor*, int) -> caf::behavior {
      return {[](multidev::atoms::wait_atom, uint64_t seq) { return seq; }};
    },
    0);
  auto sink = multidev::detail::reply_sink::make(*sys);
  std::promise<void> in_handler, let_go;
  auto let_go_done = let_go.get_future();
  std::atomic<bool> replied{false};
  BOOST_TEST_REQUIRE(sink->wait(caf::actor_cast<caf::actor>(target), 7,
                                [&](const caf::message& m) {
                                  replied = m.match_element<uint64_t>(0);
                                  in_handler.set_value();
                                  let_go_done.wait();
                                }));
  bounded([&] { in_handler.get_future().wait(); }, "the reply");
  sink.reset(); // the delivering thread now holds the last reference
  let_go.set_value();
  BOOST_TEST(replied.load());
  caf::anon_send_exit(target, caf::exit_reason::user_shutdown);
  // Every actor ends, the sink's companion included.
  bounded([&] { sys->await_all_actors_done(); }, "the actors' end");
  sys.reset();
}

// -- issue 36 points 5 and 7: the last reference, from anywhere; a node actor ---

namespace {

/// Queues on `b`'s devices 0 and 1 a task that drops the last reference to
/// `b` (once `b` itself is let go: this takes it), 201 counted tasks behind
/// and beside it, and returns the two devices' cores, weakly: no device
/// handle is kept (one would keep its device alive), so the device actors'
/// state are the devices' last owners, as in a program that let go.
std::vector<std::weak_ptr<multidev::detail::device_core>>
drop_inside_a_task(std::shared_ptr<backend> b, std::atomic<int>& after,
                   std::promise<void>& dropped) {
  auto d0 = b->get_device(0), d1 = b->get_device(1);
  std::vector<std::weak_ptr<multidev::detail::device_core>> cores{d0.get_runner().core(),
                                                                  d1.get_runner().core()};
  b->alloc_pool(d0, 1, 4096, 64);
  auto hold = std::make_shared<latch_gate>();
  auto holder = std::make_shared<std::shared_ptr<backend>>(b);
  b->schedule_task(d0, {"drops the backend", [hold, holder, &dropped] {
                          hold->wait_in_task();
                          holder->reset(); // the last reference: ~backend here
                          dropped.set_value();
                        }});
  for (int i = 0; i < 100; ++i) {
    b->schedule_task(d0, {"after, on d0", [&after] { ++after; }});
    b->schedule_task(d1, {"on d1", [&after] { ++after; }});
  }
  // d1's tail waits for d0's work, which waits for the task above.
  b->will_wait_for(b->make_context(d1), b->all_work(d0));
  b->schedule_task(d1, {"tail", [&after] { ++after; }});
  holder.reset();
  b.reset(); // only the task holds the backend now
  hold->open();
  return cores;
}

} // namespace

BOOST_AUTO_TEST_CASE(test_shutdown_last_reference_dropped_inside_its_own_task) {
  // The runner that runs the task runs ~backend: it must not wait for itself
  // (its own join, or the device actors whose end joins it). The work queued
  // behind that task still runs, and everything ends: threads, devices.
  auto baseline = thread_count();
  std::atomic<int> after{0};
  std::promise<void> dropped;
  auto dropped_fut = dropped.get_future();
  auto cores = drop_inside_a_task(
    std::make_shared<backend>(test_support::on_test_driver(backend_options{.num_devices = 2})),
    after, dropped);
  bounded([&] { dropped_fut.wait(); }, "~backend inside its own task");
  // The teardown goes on after the task: the accepted work drains, the
  // runners and the backend's actor system end, the devices go.
  BOOST_TEST(eventually([&] { return after.load() == 201; }), "ran " << after.load());
  BOOST_TEST(eventually([&] { return thread_count() <= baseline; }),
             "threads: " << thread_count() << ", before the backend: " << baseline);
  for (auto& c : cores)
    BOOST_TEST(eventually([&] { return c.expired(); }));
}

BOOST_AUTO_TEST_CASE(test_shutdown_last_reference_dropped_inside_a_task_on_a_system_the_program_owns) {
  // The same on a system the program owns and destroys as soon as the task
  // has let go: the system's destructor waits until the teardown handed
  // over is complete, so by then all the work ran and the devices are gone.
  std::atomic<int> after{0};
  std::vector<std::weak_ptr<multidev::detail::device_core>> cores;
  bounded(
    [&] {
      caf::actor_system_config cfg;
      caf::actor_system sys{program_config(cfg)};
      std::promise<void> dropped;
      cores = drop_inside_a_task(std::make_shared<backend>(sys, backend_options{.num_devices = 2}),
                                 after, dropped);
      dropped.get_future().wait();
    },
    "~backend inside its own task, then ~actor_system");
  BOOST_TEST(after.load() == 201);
  for (auto& c : cores)
    BOOST_TEST(c.expired());
}

BOOST_AUTO_TEST_CASE(test_shutdown_last_reference_dropped_in_a_handler_on_its_own_system) {
  // A user actor on the backend's own actor system drops the last reference
  // inside a handler: ~backend runs on one of that system's workers, which
  // cannot wait for all actors (its own is running) nor join the workers.
  auto baseline = thread_count();
  std::atomic<int> ran{0};
  std::promise<void> dropped;
  auto dropped_fut = dropped.get_future();
  {
    auto b = std::make_shared<backend>(backend_options{.num_devices = 1, .scheduler_threads = 2});
    auto d = b->get_device(0);
    for (int i = 0; i < 100; ++i)
      b->schedule_task(d, {"inc", [&ran] { ++ran; }});
    auto holder = std::make_shared<std::shared_ptr<backend>>(b);
    caf::actor user;
    {
      // An argument, though unused: CAF 0.17 spawns a function without one
      // through a null tuple pointer (UBSan).
      user = b->system().spawn(
        [holder, &dropped](caf::event_based_actor* self, int) -> caf::behavior {
          return {[=, &dropped](multidev::atoms::cancel_atom) {
            holder->reset(); // the last reference: ~backend on this worker
            dropped.set_value();
            self->quit();
          }};
        },
        0);
      // Spawning tied this thread to the system's logger, which the
      // system's destructor (on another thread) would wait for.
      caf::logger::set_current_actor_system(nullptr);
    }
    holder.reset();
    caf::anon_send(user, multidev::atoms::cancel_atom::value);
    user = nullptr;
    b.reset(); // the actor's holder is the last one
  }
  bounded([&] { dropped_fut.wait(); }, "~backend inside a handler on its own system");
  BOOST_TEST(eventually([&] { return ran.load() == 100; }), "ran " << ran.load());
  BOOST_TEST(eventually([&] { return thread_count() <= baseline; }),
             "threads: " << thread_count() << ", before the backend: " << baseline);
}

BOOST_AUTO_TEST_CASE(test_shutdown_node_actor_never_stopped_does_not_hold_the_backend) {
  // The node actor serves the backend's devices and goes with it, even
  // while something still holds it (the program, or the middleman after
  // `publish_node`): an actor system waits for every actor on it, so one
  // left running held ~backend (its own system) or ~actor_system forever.
  auto baseline = thread_count();
  multidev::node_actor kept;
  bounded(
    [&] {
      backend b{backend_options{.num_devices = 2, .scheduler_threads = 2}};
      kept = multidev::spawn_node_actor(b, "kept");
      auto published = multidev::spawn_node_actor(b, "published");
      BOOST_TEST_REQUIRE(static_cast<bool>(multidev::publish_node(published, 0, "127.0.0.1")));
      b.schedule_task(b.get_device(0), {"t", [] {}});
    },
    "~backend with node actors");
  kept = nullptr;
  // The same on a system the program owns: its destructor waits for every
  // actor.
  bounded(
    [&] {
      caf::actor_system_config cfg;
      caf::actor_system sys{program_config(cfg)};
      backend b{sys, backend_options{.num_devices = 1}};
      kept = multidev::spawn_node_actor(b, "kept");
    },
    "~actor_system after ~backend with a node actor");
  kept = nullptr;
  BOOST_TEST(eventually([&] { return thread_count() <= baseline; }),
             "threads: " << thread_count() << ", before: " << baseline);
}
