// Faults injected where the runtime must not give way: an allocation that
// fails while the runner formats a failure or a wait is being registered, and
// a waiter callback that throws. Nothing may kill the process, strand a
// waiter or leave a gate half-open (issue 6, defects 5 and 7).
//
// This binary replaces the global operator new (failing_alloc.hpp): an
// armed countdown on one thread makes the k-th allocation from now on that
// thread throw bad_alloc.
#define BOOST_TEST_MODULE faults
#pragma GCC diagnostic ignored "-Wmismatched-new-delete" // see failing_alloc.hpp
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "actors/core/device_core.hpp" // when_done: waiters on the runner thread

#include "test_support.hpp"

#include <atomic>
#include <string>
#include <cstdlib>
#include <new>
#include <optional>
#include <stdexcept>

#include "failing_alloc.hpp"

using namespace multidev;
using test_support::alloc_countdown;
using test_support::block_runner;
using test_support::bounded;

BOOST_AUTO_TEST_CASE(test_faults_failure_formatting_out_of_memory_still_fails_the_device_cleanly) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);
  // The task's exception is made before the allocation fails, so it is the
  // runner's own formatting of the failure that runs out of memory.
  b.schedule_task(d, {"boom", [] {
                        std::runtime_error e{"the original message, long enough to allocate"};
                        alloc_countdown = 1; // the runner's next allocation fails
                        throw e;
                      }});
  auto failing = b.all_work(d);
  release->open();
  try {
    bounded([&] { b.sync(failing); }, "sync");
    BOOST_ERROR("sync on a failed event returned");
  } catch (const device_error& e) {
    BOOST_TEST(e.device_name() == d.name());
    // The formatted message was lost; a fixed one stands in for it.
    BOOST_TEST(e.message() == "task failed", e.what());
  }
  BOOST_TEST(failing.is_failed());
  // The device stays failed, the process and the backend stay usable.
  BOOST_CHECK_THROW(b.schedule_task(d, {"after", [] {}}), device_error);
}

BOOST_AUTO_TEST_CASE(test_faults_throwing_waiter_does_not_kill_the_runner_or_strand_others) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto core = d.get_runner().core();
  auto release = block_runner(b, d);
  b.schedule_task(d, {"work", [] {}});
  auto e = b.all_work(d);
  std::atomic<int> second{0};
  core->events().when_done(e.seq(),
                          [](const std::string*) { throw std::runtime_error("waiter boom"); });
  core->events().when_done(e.seq(), [&](const std::string* error) { second = error ? 2 : 1; });
  release->open();
  bounded([&] { b.sync(e); }, "sync");
  // The event is done once the runner publishes its progress; it calls the
  // waiters just after, on its own thread: wait for the second one's call
  // (bounded), rather than expect it to have happened already.
  BOOST_TEST(test_support::eventually([&] { return second.load() != 0; }),
             "the waiter after the throwing one was never called");
  BOOST_TEST(second.load() == 1);
  // The runner lives on.
  b.schedule_task(d, {"later", [] {}});
  bounded([&] { b.await(d); }, "await");
  BOOST_TEST(b.is_idle(d));
}

BOOST_AUTO_TEST_CASE(test_faults_will_wait_for_that_runs_out_of_memory_never_strands_the_device) {
  // The k-th allocation of will_wait_for fails, for every k until one call
  // gets through: whichever step it hits, the waiting device must end up
  // either unaffected or failed, never parked forever on a gate nobody opens.
  bool got_through = false;
  for (int k = 1; k <= 64 && !got_through; ++k) {
    backend b{backend_options{.num_devices = 2}};
    auto owner = b.get_device(0), waiter = b.get_device(1);
    auto release = block_runner(b, owner);
    auto ev = b.all_work(owner);
    bool threw = false;
    try {
      alloc_countdown = k;
      b.will_wait_for(b.make_context(waiter), ev);
      alloc_countdown = 0;
    } catch (const std::bad_alloc&) {
      alloc_countdown = 0;
      threw = true;
    }
    got_through = !threw;
    // The waiting device may already have failed (the wait could not be
    // registered, so its gate failed): then new work is refused.
    std::optional<event> after;
    try {
      b.schedule_task(waiter, {"after the wait", [] {}});
      after = b.all_work(waiter);
    } catch (const device_error&) {
      BOOST_TEST(threw, "k = " << k);
    }
    release->open();
    if (after) {
      bounded(
        [&] {
          try {
            b.sync(*after);
          } catch (const device_error&) {
            BOOST_TEST(threw, "k = " << k);
          }
        },
        "sync on the waiting device after a failed will_wait_for");
      if (!threw)
        BOOST_TEST(after->is_done(), "k = " << k);
    }
  }
  BOOST_TEST(got_through);
}
