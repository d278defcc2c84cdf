// Situations that once hung, spun or leaked (found in review): a failed
// device's idle runner, backpressure met by runners and actors, the merge
// buffer outliving its pool, and error replies that named the device twice.
#define BOOST_TEST_MODULE robustness
#include <boost/test/unit_test.hpp>

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "actors/core/device_core.hpp" // queue().sleeping()

#include "test_support.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

using namespace std::chrono_literals;
using namespace multidev;
using test_support::bounded;
using test_support::eventually;
using test_support::contains;
using test_support::scheduled_count;

BOOST_AUTO_TEST_CASE(test_robustness_failed_device_runner_goes_to_sleep) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  std::atomic<bool> go{false};
  b.schedule_task(d, task{"hold", [&go] { go.wait(false); }, {}});
  b.schedule_task(d, task{"boom", [] { throw std::runtime_error("boom"); }, {}});
  for (int i = 0; i < 5; ++i) // queued behind the failure: dropped with it
    b.schedule_task(d, task{"dropped", [] {}, {}});
  go = true;
  go.notify_one();
  BOOST_CHECK_THROW(bounded([&] { b.await(d); }, "await"), device_error);
  // The dropped items must not look pending to the runner forever.
  auto core = d.get_runner().core();
  BOOST_TEST(eventually([&] { return (core->queue().sleeping() != multidev::detail::device_core::work_queue_t::awake); }));
}

BOOST_AUTO_TEST_CASE(test_robustness_runner_never_waits_for_room_in_another_queue) {
  backend b{backend_options{.num_devices = 2, .queue_capacity = 2}};
  auto a = b.get_device(0), bd = b.get_device(1);
  std::atomic<bool> go{false};
  std::atomic<int> ran{0};
  b.schedule_task(a, task{"hold", [&go] { go.wait(false); }, {}});
  // B parks on A's next event; that event's task floods B's (full) queue.
  b.schedule_task(a, task{"flood b",
                          [&] {
                            for (int i = 0; i < 6; ++i)
                              b.schedule_task(bd, task{"on b", [&ran] { ++ran; }, {}});
                          },
                          {}});
  b.will_wait_for(b.make_context(bd), b.all_work(a));
  b.schedule_task(bd, task{"after the wait", [&ran] { ++ran; }, {}});
  b.schedule_task(bd, task{"fills b", [&ran] { ++ran; }, {}});
  go = true;
  go.notify_one();
  bounded([&] { b.await(a); }, "await a");
  bounded([&] { b.await(bd); }, "await b");
  BOOST_TEST(ran.load() == 8);
}

BOOST_AUTO_TEST_CASE(test_robustness_actor_schedule_is_flow_controlled_without_blocking) {
  backend b{backend_options{.num_devices = 2, .queue_capacity = 2}};
  auto owner = b.get_device(0), waiter = b.get_device(1);
  std::atomic<bool> go{false};
  b.schedule_task(owner, task{"hold", [&go] { go.wait(false); }, {}});
  auto owner_seq = b.all_work(owner).seq();
  b.alloc_pool(waiter, 1, 64 * sizeof(float), 64);
  auto wa = device_actor_of(b, waiter);
  {
    caf::scoped_actor self{b.system()};
    bool ok = false;
    self->request(wa, 30s, atoms::depend_atom::value,
                  caf::actor_cast<caf::actor>(device_actor_of(b, owner)), owner_seq)
      .receive([&](uint64_t) { ok = true; }, [&](caf::error&) {});
    BOOST_TEST_REQUIRE(ok);
    // More named tasks than the queue holds, by message, while the waiter is
    // parked: the handler must not block the worker that will deliver the
    // owner's reply.
    // The queue holds 2: the actor defers the rest (flow control) instead of
    // growing the queue, and stays responsive meanwhile.
    std::vector<uint64_t> seqs;
    std::vector<decltype(self->request(wa, 30s, atoms::schedule_atom::value, task_spec{}))>
      pending;
    for (int i = 0; i < 6; ++i)
      pending.push_back(self->request(
        wa, 30s, atoms::schedule_atom::value,
        task_spec{"fill", {buffer_arg{{1, 0}, 64 * sizeof(float)}, 1.0 * i}}));
    std::string info;
    self->request(wa, 30s, atoms::debug_atom::value)
      .receive([&](std::string s) { info = std::move(s); }, [&](caf::error&) {});
    BOOST_TEST_REQUIRE(!info.empty()); // handled after the six schedules
    // At most `capacity` entries wait in the queue, and at most as many more
    // sit in the batch the parked runner took (the gate and what followed it).
    auto queued = scheduled_count(b, waiter);
    BOOST_TEST(queued <= 2 * 2, "waiter queue grew to " << queued << " entries");
    BOOST_TEST(queued < 1 + 6);
    go = true;
    go.notify_one();
    for (auto& p : pending)
      p.receive([&](uint64_t seq) { seqs.push_back(seq); }, [&](caf::error&) {});
    BOOST_TEST_REQUIRE(seqs.size() == 6u);
    BOOST_TEST(std::is_sorted(seqs.begin(), seqs.end()));
  }
  bounded([&] { b.await(waiter); }, "await waiter");
  BOOST_TEST(b.is_idle(waiter));
  BOOST_TEST(scheduled_count(b, waiter) == 1 + 6);
}

BOOST_AUTO_TEST_CASE(test_robustness_freed_merge_buffer_is_released) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  tnode t{7, "g", 1 << 20, memory_mode::on_device};
  std::vector<float> host(t.size_in_bytes / sizeof(float), 2.0f);
  auto src = b.init_from_host(b.make_context(d1), t, std::as_bytes(std::span{host}));
  auto dst = b.make_context(d0);
  auto copy = b.device_to_device(t, merge_buffer_use::copy, dst, src);
  BOOST_TEST_REQUIRE(copy.has_value());
  bounded([&] { b.await(d0); }, "await");
  BOOST_TEST(b.get_used_memory(d0) == t.size_in_bytes); // the merge buffer
  // A routine holds the pools its task writes, the merge buffer included, as
  // every routine does; drop it so the free is the last reference.
  copy.reset();
  b.free_pool(d0, 0);
  bounded([&] { b.await(d0); }, "await");
  BOOST_TEST(b.get_used_memory(d0) == 0u);
}

BOOST_AUTO_TEST_CASE(test_robustness_wait_error_names_the_device_once) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  std::atomic<bool> go{false};
  b.schedule_task(d, task{"hold", [&go] { go.wait(false); }, {}});
  b.schedule_task(d, task{"boom", [] { throw std::runtime_error("original"); }, {}});
  auto seq = b.all_work(d).seq();
  auto a = device_actor_of(b, d);
  std::optional<caf::error> err;
  {
    caf::scoped_actor self{b.system()};
    auto pending = self->request(a, 30s, atoms::wait_atom::value, seq);
    go = true;
    go.notify_one();
    pending.receive([](uint64_t) {}, [&](caf::error& e) { err = e; });
  }
  BOOST_TEST_REQUIRE(err.has_value());
  try {
    throw_error(*err, "");
  } catch (const device_error& e) {
    BOOST_TEST(e.device_name() == d.name());
    BOOST_TEST(e.message().find("original") != std::string::npos);
    BOOST_TEST(e.message().find(d.name()) == std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(test_robustness_wait_after_shutdown_fails_at_once) {
  auto b = std::make_unique<backend>(backend_options{.num_devices = 1});
  auto d = b->get_device(0);
  b->schedule_task(d, task{"one", [] {}, {}});
  auto r = d.get_runner(); // holds the device's core past the backend
  b.reset();
  // A seq that was never scheduled can never complete: the wait fails at once.
  event never{r, 1000};
  try {
    bounded([&] { never.sync(); }, "sync");
    BOOST_ERROR("sync on a seq never scheduled returned");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "seq 1000 was never scheduled"), e.what());
  }
  event done{r, 1};
  BOOST_TEST(done.is_done());
}

BOOST_AUTO_TEST_CASE(test_robustness_one_event_awaited_by_many_devices_and_threads) {
  backend b{backend_options{.num_devices = 4}};
  auto owner = b.get_device(0);
  std::atomic<bool> go{false};
  std::atomic<bool> owner_done{false};
  b.schedule_task(owner, task{"hold", [&go] { go.wait(false); }, {}});
  b.schedule_task(owner, task{"done", [&owner_done] { owner_done = true; }, {}});
  auto e = b.all_work(owner);
  std::atomic<int> after{0}, early{0};
  for (int i = 1; i < 4; ++i) {
    auto d = b.get_device(i);
    b.will_wait_for(b.make_context(d), e);
    b.schedule_task(d, task{"after e", [&] { (owner_done ? after : early)++; }, {}});
  }
  std::vector<std::future<bool>> hosts;
  for (int i = 0; i < 4; ++i)
    hosts.push_back(std::async(std::launch::async, [&] {
      b.sync(e);
      return owner_done.load();
    }));
  BOOST_TEST(!e.is_done());
  go = true;
  go.notify_one();
  for (auto& h : hosts) {
    BOOST_TEST_REQUIRE((h.wait_for(30s) == std::future_status::ready));
    BOOST_TEST(h.get()); // no host thread returned before the event
  }
  for (int i = 1; i < 4; ++i)
    bounded([&] { b.await(b.get_device(i)); }, "await waiter");
  BOOST_TEST(after.load() == 3);
  BOOST_TEST(early.load() == 0);
}
