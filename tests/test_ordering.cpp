// Ordering guarantees (SPEC §5.1-5.3): FIFO per device under concurrent
// producers, all_work exactness, will_wait_for edges in random DAGs over many
// devices, and backpressure that waits instead of dropping.
#define BOOST_TEST_MODULE ordering
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "test_support.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using multidev::backend;
using multidev::backend_options;
using test_support::block_runner;
using test_support::bounded;
using test_support::eventually;
using test_support::latch_gate;
using test_support::on_test_driver;
namespace data = boost::unit_test::data;

// -- FIFO ----------------------------------------------------------------------

BOOST_DATA_TEST_CASE(test_ordering_fifo_per_device_under_concurrent_producers,
                     data::make({1, 2}), ndev) {
  constexpr int threads = 4;
  constexpr int per_thread = 5000;
  backend b{on_test_driver({.num_devices = ndev})};
  std::vector<multidev::device> devs;
  for (int i = 0; i < ndev; ++i)
    devs.push_back(b.get_device(i));
  // One log per device, written only by that device's runner.
  std::vector<std::vector<std::pair<int, int>>> logs(static_cast<std::size_t>(ndev));
  std::vector<std::thread> producers;
  std::atomic<int> go{0};
  for (int t = 0; t < threads; ++t)
    producers.emplace_back([&, t] {
      while (go.load() == 0)
        std::this_thread::yield();
      for (int i = 0; i < per_thread; ++i) {
        auto k = static_cast<std::size_t>((t + i) % ndev);
        auto* log = &logs[k];
        b.schedule_task(devs[k], {"log", [log, t, i] { log->emplace_back(t, i); }});
      }
    });
  go = 1;
  bounded([&] {
    for (auto& p : producers)
      p.join();
    for (auto& d : devs)
      b.await(d);
  });
  std::size_t total = 0;
  std::vector<std::vector<int>> seen(threads, std::vector<int>(per_thread, 0));
  for (int k = 0; k < ndev; ++k) {
    auto& log = logs[static_cast<std::size_t>(k)];
    total += log.size();
    std::vector<int> last(threads, -1);
    bool in_order = true;
    for (auto [t, i] : log) {
      if (i <= last[static_cast<std::size_t>(t)])
        in_order = false;
      last[static_cast<std::size_t>(t)] = i;
      ++seen[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)];
      if ((t + i) % ndev != k)
        in_order = false; // ran on a device it was not scheduled on
    }
    BOOST_TEST(in_order, "device " << k << ": a producer's tasks ran out of order");
  }
  BOOST_TEST(total == static_cast<std::size_t>(threads * per_thread));
  bool exactly_once = true;
  for (auto& row : seen)
    for (int n : row)
      exactly_once = exactly_once && n == 1;
  BOOST_TEST(exactly_once);
}

// -- all_work ------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_ordering_all_work_is_done_exactly_when_earlier_work_is) {
  backend b{on_test_driver({.num_devices = 1})};
  auto d = b.get_device(0);
  constexpr int n = 50;
  auto first_gate = std::make_shared<latch_gate>();
  auto later_gate = std::make_shared<latch_gate>();
  std::vector<std::atomic<bool>> finished(n);
  b.schedule_task(d, {"hold earlier", [first_gate] { first_gate->wait(); }});
  for (int i = 0; i < n; ++i)
    b.schedule_task(d, {"earlier", [&finished, i] { finished[static_cast<std::size_t>(i)] = true; }});
  auto ev = b.all_work(d);
  // Right after the call: must see the event done and every earlier task done.
  std::atomic<int> checker{-1};
  b.schedule_task(d, {"check", [&] {
                        bool all = std::all_of(finished.begin(), finished.end(),
                                               [](auto& f) { return f.load(); });
                        checker = (b.is_done(ev) && all) ? 1 : 0;
                      }});
  // Scheduled after the call: not required by the event.
  std::atomic<bool> later_ran{false};
  b.schedule_task(d, {"later", [&, later_gate] {
                        later_gate->wait();
                        later_ran = true;
                      }});
  BOOST_TEST(!b.is_done(ev)); // earlier work is held back
  first_gate->open();
  bounded([&] { b.sync(ev); }); // must not need the held "later" task
  BOOST_TEST(!later_ran.load());
  bool all = std::all_of(finished.begin(), finished.end(), [](auto& f) { return f.load(); });
  BOOST_TEST(all);
  BOOST_TEST(b.is_done(ev));
  later_gate->open();
  bounded([&] { b.await(d); });
  BOOST_TEST(checker.load() == 1);
  BOOST_TEST(later_ran.load());
}

BOOST_AUTO_TEST_CASE(test_ordering_all_work_from_many_threads_covers_own_prior_tasks) {
  // Each producer takes all_work right after its own task: that event must
  // cover the producer's task (whatever other producers interleave).
  backend b{on_test_driver({.num_devices = 2})};
  auto d = b.get_device(0);
  constexpr int threads = 3, per_thread = 300;
  std::vector<std::vector<std::atomic<bool>>> done(threads);
  for (auto& v : done)
    v = std::vector<std::atomic<bool>>(per_thread);
  std::atomic<int> violations{0};
  std::vector<std::future<void>> fs;
  for (int t = 0; t < threads; ++t)
    fs.push_back(std::async(std::launch::async, [&, t] {
      for (int i = 0; i < per_thread; ++i) {
        auto* flag = &done[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)];
        b.schedule_task(d, {"mark", [flag] { *flag = true; }});
        auto ev = b.all_work(d);
        if (i % 10 == 0) {
          b.sync(ev);
          if (!flag->load())
            ++violations;
        } else if (b.is_done(ev) && !flag->load()) {
          ++violations;
        }
      }
    }));
  bounded([&] {
    for (auto& f : fs)
      f.get();
    b.await(d);
  });
  BOOST_TEST(violations.load() == 0);
}

BOOST_AUTO_TEST_CASE(test_ordering_sync_returns_while_the_next_task_blocks) {
  // The task after an awaited one waits for the host to see that event done:
  // the event must resolve without help from later work (no lost wake-ups).
  backend b{on_test_driver({.num_devices = 1})};
  auto d = b.get_device(0);
  constexpr int rounds = 20000;
  std::atomic<int> stuck{0};
  bounded(
    [&] {
      for (int i = 0; i < rounds; ++i) {
        auto seen = std::make_shared<std::atomic<int>>(0);
        b.schedule_task(d, {"a", [] {}});
        auto ev = b.all_work(d);
        b.schedule_task(d, {"b", [seen, &stuck] {
                              auto deadline = std::chrono::steady_clock::now() + 5s;
                              while (seen->load() == 0) {
                                if (std::chrono::steady_clock::now() > deadline) {
                                  ++stuck;
                                  return;
                                }
                                std::this_thread::yield();
                              }
                            }});
        b.sync(ev);
        *seen = 1;
        if (stuck.load() != 0)
          break;
      }
      b.await(d);
    },
    "20000 schedule/sync rounds", 120s);
  BOOST_TEST(stuck.load() == 0);
}

// -- will_wait_for in random DAGs ---------------------------------------------

namespace {

struct dag_event {
  multidev::event ev;
  int device;
  std::size_t covered; // the first `covered` tasks of `device`
};

struct dag_edge {
  std::size_t event;
  int waiter;
  std::size_t from; // tasks of `waiter` from this position on must wait
};

/// One random DAG: returns a description of the first violated constraint, or
/// an empty string. Adds to `live_edges` the waits that were still pending
/// when made (so the run exercised real cross-device waits).
std::string run_random_dag(int ndev, uint32_t seed, int& live_edges) {
  std::mt19937 rng{seed};
  backend b{on_test_driver({.num_devices = ndev})};
  std::vector<multidev::device> devs;
  std::vector<multidev::context> ctxs;
  for (int i = 0; i < ndev; ++i) {
    devs.push_back(b.get_device(i));
    ctxs.push_back(b.make_context(devs.back()));
  }
  const int ntasks = 100 + static_cast<int>(rng() % 150);
  std::atomic<uint64_t> clock{0};
  std::vector<uint64_t> finished_at(static_cast<std::size_t>(ntasks), 0);
  std::vector<std::vector<int>> on(static_cast<std::size_t>(ndev));
  std::vector<dag_event> events;
  std::vector<dag_edge> edges;
  for (int i = 0; i < ntasks; ++i) {
    int k = static_cast<int>(rng() % static_cast<uint32_t>(ndev));
    auto ku = static_cast<std::size_t>(k);
    if (!events.empty() && rng() % 3 != 0) {
      auto e = rng() % events.size();
      if (events[e].device != k && !events[e].ev.is_done())
        ++live_edges;
      b.will_wait_for(ctxs[ku], events[e].ev);
      edges.push_back({e, k, on[ku].size()});
    }
    unsigned spin = rng() % 4 == 0 ? rng() % 2000 : 0;
    auto* slot = &finished_at[static_cast<std::size_t>(i)];
    b.schedule_task(devs[ku], {"t" + std::to_string(i), [slot, &clock, spin] {
                                 volatile unsigned x = 0;
                                 for (unsigned j = 0; j < spin; ++j)
                                   x = x + j;
                                 *slot = ++clock;
                               }});
    on[ku].push_back(i);
    if (rng() % 2 == 0)
      events.push_back({b.all_work(devs[ku]), k, on[ku].size()});
  }
  auto idle = std::async(std::launch::async, [&] {
    for (auto& d : devs)
      b.await(d);
  });
  if (idle.wait_for(30s) != std::future_status::ready) {
    new decltype(idle)(std::move(idle));
    return "devices did not become idle within 30 s";
  }
  idle.get();
  for (int i = 0; i < ntasks; ++i)
    if (finished_at[static_cast<std::size_t>(i)] == 0)
      return "task " + std::to_string(i) + " never ran";
  for (auto& e : events)
    if (!e.ev.is_done())
      return "an event is not done after await";
  for (int k = 0; k < ndev; ++k) {
    auto& ts = on[static_cast<std::size_t>(k)];
    for (std::size_t j = 1; j < ts.size(); ++j)
      if (finished_at[static_cast<std::size_t>(ts[j - 1])]
          > finished_at[static_cast<std::size_t>(ts[j])])
        return "FIFO violated on device " + std::to_string(k);
  }
  for (auto& edge : edges) {
    auto& e = events[edge.event];
    uint64_t last_awaited = 0;
    auto& src = on[static_cast<std::size_t>(e.device)];
    for (std::size_t j = 0; j < e.covered; ++j)
      last_awaited = std::max(last_awaited, finished_at[static_cast<std::size_t>(src[j])]);
    auto& dst = on[static_cast<std::size_t>(edge.waiter)];
    for (std::size_t j = edge.from; j < dst.size(); ++j) {
      auto t = dst[j];
      if (finished_at[static_cast<std::size_t>(t)] < last_awaited)
        return "task " + std::to_string(t) + " on device " + std::to_string(edge.waiter)
               + " finished (at " + std::to_string(finished_at[static_cast<std::size_t>(t)])
               + ") before the awaited work of device " + std::to_string(e.device)
               + " (at " + std::to_string(last_awaited) + ")";
    }
  }
  return {};
}

} // namespace

BOOST_DATA_TEST_CASE(test_ordering_random_dags_respect_will_wait_for,
                     data::xrange(2, 9), ndev) {
  constexpr uint32_t seeds_per_count = 29; // 7 device counts: 203 DAGs
  int failures = 0, live_edges = 0;
  for (uint32_t s = 0; s < seeds_per_count; ++s) {
    auto seed = static_cast<uint32_t>(ndev) * 1000u + s;
    auto why = run_random_dag(ndev, seed, live_edges);
    BOOST_TEST(why.empty(), "devices " << ndev << ", seed " << seed << ": " << why);
    if (!why.empty() && ++failures >= 3)
      break;
  }
  BOOST_TEST_MESSAGE(ndev << " devices: " << live_edges << " waits on pending events");
  BOOST_TEST(live_edges > 0); // the DAGs did make devices wait on each other
}

// -- backpressure ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_ordering_backpressure_blocks_producer_and_drops_nothing) {
  constexpr std::size_t capacity = 4;
  constexpr int extra = 12;
  // One item in flight (the blocker), so that on an asynchronous driver the
  // runner takes nothing more off the queue while the blocker holds.
  backend b{on_test_driver({.num_devices = 1, .queue_capacity = capacity, .max_in_flight = 1})};
  auto d = b.get_device(0);
  auto release = block_runner(b, d); // the runner holds the blocker; queue empty
  std::vector<int> order;
  std::atomic<int> returned{0};
  auto producer = std::async(std::launch::async, [&] {
    for (int i = 0; i < extra; ++i) {
      b.schedule_task(d, {"t", [&order, i] { order.push_back(i); }});
      ++returned;
    }
  });
  // The queue fills up and the producer waits for room.
  BOOST_REQUIRE(eventually([&] { return returned.load() >= static_cast<int>(capacity); }));
  std::this_thread::sleep_for(200ms);
  BOOST_TEST(returned.load() == static_cast<int>(capacity));
  BOOST_TEST((producer.wait_for(0s) == std::future_status::timeout));
  BOOST_TEST(order.empty());
  release->open();
  BOOST_REQUIRE(producer.wait_for(30s) == std::future_status::ready);
  producer.get();
  bounded([&] { b.await(d); });
  BOOST_TEST(returned.load() == extra);
  BOOST_TEST_REQUIRE(order.size() == static_cast<std::size_t>(extra));
  for (int i = 0; i < extra; ++i)
    BOOST_TEST(order[static_cast<std::size_t>(i)] == i);
}

BOOST_AUTO_TEST_CASE(test_ordering_backpressure_many_producers_tiny_queue) {
  backend b{on_test_driver({.num_devices = 2, .queue_capacity = 2})};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  constexpr int threads = 3, per_thread = 2000;
  std::vector<std::vector<int>> logs(threads);
  std::mutex mu;
  std::vector<std::future<void>> fs;
  for (int t = 0; t < threads; ++t)
    fs.push_back(std::async(std::launch::async, [&, t] {
      for (int i = 0; i < per_thread; ++i) {
        // Alternate devices, with cross-device waits, through a tiny queue.
        auto& d = i % 2 ? d1 : d0;
        if (i % 50 == 0)
          b.will_wait_for(b.make_context(d), b.all_work(i % 2 ? d0 : d1));
        b.schedule_task(d, {"log", [&, t, i] {
                              std::lock_guard g{mu};
                              logs[static_cast<std::size_t>(t)].push_back(i);
                            }});
      }
    }));
  bounded([&] {
    for (auto& f : fs)
      f.get();
    b.await(d0);
    b.await(d1);
  });
  for (int t = 0; t < threads; ++t) {
    auto& log = logs[static_cast<std::size_t>(t)];
    BOOST_TEST_REQUIRE(log.size() == static_cast<std::size_t>(per_thread));
    // Per device, this producer's tasks ran in its order.
    int last_even = -1, last_odd = -1;
    bool ok = true;
    for (int i : log) {
      int& last = i % 2 ? last_odd : last_even;
      ok = ok && i > last;
      last = i;
    }
    BOOST_TEST(ok, "producer " << t);
  }
}

BOOST_AUTO_TEST_CASE(test_ordering_task_schedules_on_own_full_queue_without_deadlock) {
  constexpr std::size_t capacity = 4;
  // One in flight: on an asynchronous driver the outer task fills it, so the
  // host's tasks stay in the queue and fill it.
  backend b{on_test_driver({.num_devices = 1, .queue_capacity = capacity, .max_in_flight = 1})};
  auto d = b.get_device(0);
  auto host_filled = std::make_shared<latch_gate>();
  auto started = std::make_shared<latch_gate>();
  auto outer_done = std::make_shared<latch_gate>();
  std::vector<int> order;
  std::atomic<int> inner_scheduled{0};
  b.schedule_task(d, {"outer", [&, host_filled, started, outer_done] {
                        started->open();
                        host_filled->wait();
                        // The queue is full now; the runner must not wait for itself.
                        for (int i = 0; i < 6; ++i) {
                          b.schedule_task(d, {"inner", [&order, i] { order.push_back(100 + i); }});
                          ++inner_scheduled;
                        }
                        outer_done->open();
                      }});
  BOOST_REQUIRE(started->wait());
  bounded([&] {
    for (int i = 0; i < static_cast<int>(capacity); ++i)
      b.schedule_task(d, {"host", [&order, i] { order.push_back(i); }});
  });
  BOOST_TEST(d.get_runner().queue_length() == capacity + 1);
  host_filled->open();
  // The inner tasks are scheduled by the time outer ends: await covers them.
  BOOST_REQUIRE(outer_done->wait());
  bounded([&] { b.await(d); });
  BOOST_TEST(inner_scheduled.load() == 6);
  std::vector<int> expected{0, 1, 2, 3, 100, 101, 102, 103, 104, 105};
  BOOST_TEST(order == expected, boost::test_tools::per_element());
}
