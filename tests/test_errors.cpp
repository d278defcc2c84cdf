// Errors (SPEC §5 point 5 and the bad-input half of point 6): a task that
// throws fails its device and everything waiting on it, nothing hangs, a task
// that syncs on its own future gets `deadlock_error`, and bad input is refused
// with `std::invalid_argument` while the device's state stays as it was.
#define BOOST_TEST_MODULE errors
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <limits>
#include <memory>
#include <string>

using namespace std::chrono_literals;
using multidev::backend;
using multidev::backend_options;
using multidev::buffer_arg;
using multidev::buffer_loc;
using multidev::device;
using multidev::device_error;
using multidev::event;
using multidev::task;
using multidev::task_spec;
using test_support::blocker;
using test_support::bounded;
using test_support::contains;
using test_support::field_of;
using test_support::hang_limit;

namespace {

/// `n` devices on the suite's driver (test_support::test_driver).
backend_options two_devices(int n = 2) {
  return test_support::on_test_driver(
    backend_options{.num_devices = n, .scheduler_threads = 2});
}

task set_flag(std::shared_ptr<std::atomic<bool>> flag, std::string description = "set flag") {
  return task{std::move(description), [flag] { flag->store(true); }, {}};
}

task throwing(std::string message) {
  return task{"boom-task", [message] { throw std::runtime_error(message); }, {}};
}

/// Calls `f`, expecting `device_error`; returns it.
template <class F>
device_error expect_device_error(const char* what, F f) {
  try {
    f();
  } catch (const device_error& e) {
    return e;
  } catch (const std::exception& e) {
    BOOST_ERROR(what << ": expected device_error, got another exception: " << e.what());
    return device_error("?", "?");
  }
  BOOST_ERROR(what << ": expected device_error, nothing was thrown");
  return device_error("?", "?");
}

/// Calls `f`, expecting `std::invalid_argument`; returns its message.
template <class F>
std::string expect_invalid(const char* what, F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    BOOST_ERROR(what << ": expected std::invalid_argument, got: " << e.what());
    return {};
  }
  BOOST_ERROR(what << ": expected std::invalid_argument, nothing was thrown");
  return {};
}

/// Runs a fill + checksum on pool `pool` of `d` (which must hold `n` floats)
/// and returns the published sum: the device still works.
double still_runs(backend& b, const device& d, int pool, std::size_t n,
                  const std::string& name) {
  buffer_arg buf{buffer_loc{pool, 0}, n * sizeof(float)};
  b.schedule_named(d, task_spec{"fill", {buf, 2.0}});
  auto ev = b.schedule_named(d, task_spec{"checksum", {buf, name}});
  bounded([&] { b.sync(ev); }, "sync on a checksum");
  auto r = b.result(name);
  return r ? r->sum : -1.0;
}

/// One device `d` with pool 1 of 256 bytes, and what a refusal must leave
/// as it is: the device's debug info (`info`) and used memory (`used`).
struct pool_1_of_256_bytes {
  pool_1_of_256_bytes() {
    b.alloc_pool(d, 1, 256, 64);
    bounded([&] { b.await(d); }, "await");
    info = b.get_debug_info(d).to_string();
    used = b.get_used_memory(d);
  }

  backend b{two_devices(1)};
  device d = b.get_device(0);
  std::string info;
  std::size_t used = 0;
};

} // namespace

// -- a failing task ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_errors_throwing_task_fails_its_device) {
  backend b{two_devices()};
  auto d = b.get_device(0);
  auto other = b.get_device(1);
  const std::string original = "original message 4711";

  auto before_flag = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(d, set_flag(before_flag, "before"));
  event done_before = b.all_work(d);
  bounded([&] { b.sync(done_before); }, "sync before the failure");

  std::promise<void> release;
  b.schedule_task(d, blocker(release.get_future().share()));
  b.schedule_task(d, throwing(original));
  event failing = b.all_work(d);
  auto after_flag = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(d, set_flag(after_flag, "after"));
  event pending = b.all_work(d);
  BOOST_TEST(!pending.is_done());
  BOOST_TEST(!pending.is_failed());

  // A host thread already blocked on a pending event is woken by the failure.
  auto blocked = std::async(std::launch::async, [&] {
    try {
      b.sync(pending);
      return std::string{"returned normally"};
    } catch (const device_error& e) {
      return std::string{e.what()};
    }
  });
  release.set_value();
  BOOST_TEST_REQUIRE((blocked.wait_for(hang_limit) == std::future_status::ready),
                     "sync on a pending event hung after the device failed");
  auto blocked_what = blocked.get();
  BOOST_TEST(contains(blocked_what, original), blocked_what);
  BOOST_TEST(contains(blocked_what, b.get_name(d)), blocked_what);

  // Events finished before the failure stay done.
  BOOST_TEST(done_before.is_done());
  BOOST_TEST(!done_before.is_failed());
  BOOST_TEST(b.is_done(done_before));
  BOOST_CHECK_NO_THROW(b.sync(done_before));
  BOOST_TEST(before_flag->load());

  // Pending events resolve as failed; the work after the throw never ran.
  for (const auto& e : {failing, pending}) {
    BOOST_TEST(e.is_failed());
    BOOST_TEST(!e.is_done());
    BOOST_TEST(!b.is_done(e));
  }
  BOOST_TEST(!after_flag->load());
  BOOST_TEST(to_sexp(pending).find("state")->items()[1].as_atom() == "failed");

  // schedule_task, await and sync all throw device_error naming the device.
  auto check = [&](const device_error& e, const char* what) {
    BOOST_TEST(e.device_name() == b.get_name(d), what << ": " << e.device_name());
    BOOST_TEST(contains(e.message(), original), what << ": " << e.message());
    BOOST_TEST(!contains(e.message(), b.get_name(d)), what << ": " << e.message());
    BOOST_TEST(contains(e.what(), b.get_name(d)), what << ": " << e.what());
    BOOST_TEST(contains(e.what(), original), what << ": " << e.what());
  };
  check(expect_device_error("schedule_task",
                            [&] { b.schedule_task(d, task{"late", [] {}, {}}); }),
        "schedule_task");
  check(expect_device_error("schedule_named",
                            [&] { b.schedule_named(d, task_spec{"spin_ns", {int64_t{1}}}); }),
        "schedule_named");
  check(bounded([&] { return expect_device_error("await", [&] { b.await(d); }); }, "await"),
        "await");
  check(bounded([&] { return expect_device_error("sync", [&] { b.sync(pending); }); },
                "backend sync"),
        "backend::sync");
  check(bounded([&] { return expect_device_error("sync", [&] { failing.sync(); }); }, "event sync"),
        "event::sync");
  // An event taken after the failure is not done either, and fails too.
  auto later = b.all_work(d);
  BOOST_TEST(!later.is_done());
  check(bounded([&] { return expect_device_error("sync", [&] { later.sync(); }); },
                "sync all_work after failure"),
        "all_work after the failure");

  auto info = b.get_debug_info(d);
  BOOST_TEST(contains(field_of(info, "error"), original), info.to_string());

  // The other device is not affected.
  auto ok = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(other, set_flag(ok));
  bounded([&] { b.await(other); }, "await on the healthy device");
  BOOST_TEST(ok->load());
  BOOST_TEST(field_of(b.get_debug_info(other), "error") == "none");
}

BOOST_AUTO_TEST_CASE(test_errors_fail_kernel_message_reaches_host) {
  backend b{two_devices(1)};
  auto d = b.get_device(0);
  auto ev = b.schedule_named(d, task_spec{"fail", {std::string{"kernel said no"}}});
  auto e = bounded([&] { return expect_device_error("sync", [&] { b.sync(ev); }); },
                   "sync on a failing kernel");
  BOOST_TEST(e.device_name() == b.get_name(d));
  BOOST_TEST(contains(e.message(), "kernel said no"), e.message());
  BOOST_TEST(ev.is_failed());
}

// -- poison through a chain ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_errors_poison_propagates_through_a_chain_of_devices) {
  backend b{two_devices(3)};
  auto a = b.get_device(0);
  auto bd = b.get_device(1);
  auto c = b.get_device(2);
  auto ctx_b = b.make_context(bd);
  auto ctx_c = b.make_context(c);
  const std::string original = "chain origin failure";

  std::promise<void> release;
  b.schedule_task(a, blocker(release.get_future().share()));
  auto a_fail = b.schedule_named(a, task_spec{"fail", {original}});

  auto b_before = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(bd, set_flag(b_before, "b before the wait"));
  auto b_before_ev = b.all_work(bd);
  b.will_wait_for(ctx_b, a_fail);
  auto b_after = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(bd, set_flag(b_after, "b after the wait"));
  auto b_end = b.all_work(bd);

  b.will_wait_for(ctx_c, b_end);
  auto c_after = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(c, set_flag(c_after, "c after the wait"));
  auto c_end = b.all_work(c);

  // Nothing downstream runs while A is held.
  BOOST_TEST(!b_end.is_done());
  BOOST_TEST(!c_end.is_done());
  release.set_value();

  auto ec =
    bounded([&] { return expect_device_error("await C", [&] { b.await(c); }); }, "await C");
  auto eb =
    bounded([&] { return expect_device_error("await B", [&] { b.await(bd); }); }, "await B");
  auto ea =
    bounded([&] { return expect_device_error("await A", [&] { b.await(a); }); }, "await A");

  BOOST_TEST(ea.device_name() == b.get_name(a));
  BOOST_TEST(eb.device_name() == b.get_name(bd));
  BOOST_TEST(ec.device_name() == b.get_name(c));
  for (const auto* e : {&ea, &eb, &ec})
    BOOST_TEST(contains(e->message(), original), e->what());
  // B's error says it was waiting on A; C's, on B.
  BOOST_TEST(contains(eb.message(), b.get_name(a)), eb.message());
  BOOST_TEST(contains(ec.message(), b.get_name(bd)), ec.message());

  BOOST_TEST(b_before->load());
  BOOST_TEST(b_before_ev.is_done());
  BOOST_TEST(!b_before_ev.is_failed());
  BOOST_TEST(!b_after->load());
  BOOST_TEST(!c_after->load());
  BOOST_TEST(b_end.is_failed());
  BOOST_TEST(c_end.is_failed());

  auto eb2 = expect_device_error("schedule on B", [&] { b.schedule_task(bd, task{"x", [] {}, {}}); });
  auto ec2 = expect_device_error("schedule on C", [&] { b.schedule_task(c, task{"x", [] {}, {}}); });
  BOOST_TEST(eb2.device_name() == b.get_name(bd));
  BOOST_TEST(ec2.device_name() == b.get_name(c));
  BOOST_TEST(contains(eb2.message(), original), eb2.what());
  BOOST_TEST(contains(ec2.message(), original), ec2.what());
}

// -- no hang ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_errors_waiting_on_an_already_failed_device_does_not_hang) {
  backend b{two_devices(3)};
  auto x = b.get_device(0);
  auto y = b.get_device(1);
  auto z = b.get_device(2);
  const std::string original = "x died early";

  auto x_ok = b.schedule_named(x, task_spec{"spin_ns", {int64_t{1}}});
  auto x_fail = b.schedule_named(x, task_spec{"fail", {original}});
  bounded([&] { return expect_device_error("await X", [&] { b.await(x); }); }, "await X");
  BOOST_TEST_REQUIRE(x_fail.is_failed());
  BOOST_TEST_REQUIRE(x_ok.is_done());

  // Host sync on the failed event: an error, at once.
  auto e = bounded([&] { return expect_device_error("sync", [&] { b.sync(x_fail); }); },
                   "sync failed event");
  BOOST_TEST(contains(e.message(), original), e.what());

  // Waiting on an event that finished before the failure is a no-op.
  auto ctx_z = b.make_context(z);
  b.will_wait_for(ctx_z, x_ok);
  auto z_ran = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(z, set_flag(z_ran));
  bounded([&] { b.await(z); }, "await Z");
  BOOST_TEST(z_ran->load());

  // A device waiting on the failed event fails instead of waiting forever.
  auto ctx_y = b.make_context(y);
  BOOST_CHECK_NO_THROW(b.will_wait_for(ctx_y, x_fail));
  auto y_ran = std::make_shared<std::atomic<bool>>(false);
  // The gate may already have poisoned Y by now, or not yet; either way the
  // task after it never runs.
  try {
    b.schedule_task(y, set_flag(y_ran));
  } catch (const device_error& err) {
    BOOST_TEST(contains(err.message(), original), err.what());
  }
  auto ey = bounded([&] { return expect_device_error("await Y", [&] { b.await(y); }); }, "await Y");
  BOOST_TEST(ey.device_name() == b.get_name(y));
  BOOST_TEST(contains(ey.message(), original), ey.what());
  BOOST_TEST(!y_ran->load());
}

BOOST_AUTO_TEST_CASE(test_errors_waiting_on_a_device_that_fails_later_does_not_hang) {
  backend b{two_devices(2)};
  auto w = b.get_device(0);
  auto z = b.get_device(1);
  const std::string original = "w fails later";

  std::promise<void> release;
  b.schedule_task(w, blocker(release.get_future().share()));
  auto w_fail = b.schedule_named(w, task_spec{"fail", {original}});
  auto w_end = b.all_work(w);

  auto ctx_z = b.make_context(z);
  b.will_wait_for(ctx_z, w_end);
  auto z_ran = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(z, set_flag(z_ran));

  // Both a host thread and device Z are waiting when W fails.
  auto host = std::async(std::launch::async, [&] {
    try {
      b.sync(w_end);
      return std::string{"returned normally"};
    } catch (const device_error& e) {
      return e.message();
    }
  });
  auto z_wait = std::async(std::launch::async, [&] {
    try {
      b.await(z);
      return std::string{"returned normally"};
    } catch (const device_error& e) {
      return e.message();
    }
  });
  release.set_value();
  BOOST_TEST_REQUIRE((host.wait_for(hang_limit) == std::future_status::ready),
                     "host sync on W hung");
  BOOST_TEST_REQUIRE((z_wait.wait_for(hang_limit) == std::future_status::ready),
                     "await on Z (waiting for W) hung");
  auto host_msg = host.get();
  auto z_msg = z_wait.get();
  BOOST_TEST(contains(host_msg, original), host_msg);
  BOOST_TEST(contains(z_msg, original), z_msg);
  BOOST_TEST(w_fail.is_failed());
  BOOST_TEST(!z_ran->load());
}

// -- deadlock detection ---------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_errors_task_syncing_on_its_own_future_gets_deadlock_error) {
  backend b{two_devices(1)};
  auto d = b.get_device(0);

  auto first = b.schedule_named(d, task_spec{"spin_ns", {int64_t{1}}});
  std::promise<event> ahead_p;
  auto ahead_f = ahead_p.get_future().share();
  struct record {
    std::atomic<int> outcome{0}; // 1 deadlock_error, 2 returned, 3 other
    std::string what;
    std::atomic<bool> past_ok{false};
  };
  auto rec = std::make_shared<record>();
  b.schedule_task(d, task{"sync on own future",
                          [&b, first, ahead_f, rec] {
                            // An event behind us: fine.
                            b.sync(first);
                            rec->past_ok.store(true);
                            if (ahead_f.wait_for(60s) != std::future_status::ready)
                              throw std::runtime_error("no event handed over");
                            try {
                              b.sync(ahead_f.get());
                              rec->outcome.store(2);
                            } catch (const multidev::deadlock_error& e) {
                              rec->what = e.what();
                              rec->outcome.store(1);
                            } catch (const std::exception& e) {
                              rec->what = e.what();
                              rec->outcome.store(3);
                            }
                          },
                          {}});
  auto later_ran = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(d, set_flag(later_ran, "after the sync"));
  auto end = b.all_work(d);
  ahead_p.set_value(end);

  bounded([&] { b.sync(end); }, "sync after the deadlock attempt");
  BOOST_TEST(rec->past_ok.load());
  BOOST_TEST(rec->outcome.load() == 1, "outcome " << rec->outcome.load() << ": " << rec->what);
  BOOST_TEST(contains(rec->what, b.get_name(d)), rec->what);
  BOOST_TEST(later_ran->load());
  BOOST_TEST(field_of(b.get_debug_info(d), "error") == "none");
}

// -- bad input -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_errors_get_device_rejects_bad_ordinals) {
  backend b{two_devices(2)};
  auto n = b.num_devices();
  BOOST_TEST_REQUIRE(n == 2);
  auto before = b.get_global_debug_info().to_string();

  auto neg = expect_invalid("get_device(-1)", [&] { b.get_device(-1); });
  BOOST_TEST(contains(neg, "-1"), neg);
  BOOST_TEST(contains(neg, "2 devices"), neg);
  auto past = expect_invalid("get_device(n)", [&] { b.get_device(n); });
  BOOST_TEST(contains(past, "ordinal 2"), past);
  BOOST_TEST(contains(past, "2 devices"), past);

  BOOST_TEST(b.get_global_debug_info().to_string() == before);
  auto d = b.get_device(1);
  BOOST_TEST(d.ordinal() == 1);
  BOOST_TEST((b.get_device(1) == d)); // memoized
}

BOOST_FIXTURE_TEST_CASE(test_errors_alloc_pool_rejects_bad_alignment, pool_1_of_256_bytes) {
  for (std::size_t alignment : {std::size_t{0}, std::size_t{3}, std::size_t{48}}) {
    // A fresh pool id and the existing one: neither may change anything.
    for (int pool : {1, 2}) {
      auto msg = expect_invalid("alloc_pool", [&] { b.alloc_pool(d, pool, 128, alignment); });
      BOOST_TEST(contains(msg, "alignment " + std::to_string(alignment)), msg);
      BOOST_TEST(contains(msg, "pool " + std::to_string(pool)), msg);
    }
  }
  BOOST_TEST(b.get_debug_info(d).to_string() == info);
  BOOST_TEST(b.get_used_memory(d) == used);
  BOOST_TEST(still_runs(b, d, 1, 64, "errors_alignment") == 128.0);
}

// Issue 36 point 1: a size whose rounding to the alignment wrapped around
// was accepted with a tiny block behind it, and the pool recorded the size
// asked for: memset_zero, writes and kernels then wrote past the block.
BOOST_FIXTURE_TEST_CASE(test_errors_alloc_pool_refuses_a_size_no_device_can_hold, pool_1_of_256_bytes) {
  struct huge {
    std::size_t size;
    std::size_t alignment;
  };
  constexpr auto max = std::numeric_limits<std::size_t>::max();
  // A fresh pool id first, then the existing one, whose pool must stay.
  for (int pool : {2, 1}) {
    for (auto h : {huge{max - 10, 64}, huge{max, 1}, huge{max - 63, 64}, huge{max - 100, 4096},
                   huge{max / 2 + 1, 64}, huge{16, std::size_t{1} << 63}}) {
      auto msg = expect_invalid("alloc_pool of a huge size",
                                [&] { b.alloc_pool(d, pool, h.size, h.alignment); });
      BOOST_TEST_REQUIRE(!msg.empty(), "pool " << pool << " size " << h.size << " accepted");
      BOOST_TEST(contains(msg, "pool " + std::to_string(pool)), msg);
      BOOST_TEST(contains(msg, std::to_string(h.size)), msg);
      BOOST_TEST(contains(msg, b.get_name(d)), msg);
    }
  }
  BOOST_TEST(b.get_debug_info(d).to_string() == info);
  BOOST_TEST(b.get_used_memory(d) == used);
  auto none = expect_invalid("memset_zero on the refused pool",
                             [&] { b.memset_zero(d, 2, 0, 64); });
  BOOST_TEST(contains(none, "pool 2 is not allocated"), none);
  // Pool 1 kept its 256 bytes and the device still works.
  BOOST_TEST(contains(expect_invalid("memset past pool 1", [&] { b.memset_zero(d, 1, 0, 257); }),
                      "(256 bytes)"));
  BOOST_TEST(still_runs(b, d, 1, 64, "errors_huge_pool") == 128.0);
  b.alloc_pool(d, 2, 4096, 64);
  BOOST_CHECK_NO_THROW(b.memset_zero(d, 2, 0, 4096));
  BOOST_TEST(still_runs(b, d, 2, 1024, "errors_huge_pool_after") == 2048.0);
}

BOOST_AUTO_TEST_CASE(test_errors_free_pool_rejects_unknown_pool_and_double_free) {
  backend b{two_devices(1)};
  auto d = b.get_device(0);
  b.alloc_pool(d, 1, 256, 64);
  b.alloc_pool(d, 5, 512, 64);
  bounded([&] { b.await(d); }, "await");
  BOOST_TEST(b.get_used_memory(d) == 768u);
  auto info = b.get_debug_info(d).to_string();

  auto unknown = expect_invalid("free_pool(77)", [&] { b.free_pool(d, 77); });
  BOOST_TEST(contains(unknown, "77"), unknown);
  BOOST_TEST(b.get_debug_info(d).to_string() == info);
  BOOST_TEST(b.get_used_memory(d) == 768u);

  b.free_pool(d, 5);
  bounded([&] { b.await(d); }, "await");
  BOOST_TEST(b.get_used_memory(d) == 256u);
  info = b.get_debug_info(d).to_string();
  auto twice = expect_invalid("second free_pool(5)", [&] { b.free_pool(d, 5); });
  BOOST_TEST(contains(twice, "pool 5"), twice);
  BOOST_TEST(b.get_debug_info(d).to_string() == info);
  BOOST_TEST(b.get_used_memory(d) == 256u);
  BOOST_TEST(still_runs(b, d, 1, 64, "errors_free") == 128.0);
}

BOOST_AUTO_TEST_CASE(test_errors_memset_zero_rejects_unknown_pool_and_bad_ranges) {
  backend b{two_devices(1)};
  auto d = b.get_device(0);
  b.alloc_pool(d, 3, 256, 64);
  bounded([&] { b.await(d); }, "await");
  auto info = b.get_debug_info(d).to_string();
  auto used = b.get_used_memory(d);

  auto unknown = expect_invalid("memset unknown pool", [&] { b.memset_zero(d, 9, 0, 16); });
  BOOST_TEST(contains(unknown, "pool 9"), unknown);

  struct bad_range {
    const char* what;
    std::size_t offset;
    std::size_t size;
  };
  constexpr auto max = std::numeric_limits<std::size_t>::max();
  for (auto r : {bad_range{"offset past the end", 257, 0},
                 bad_range{"offset far past the end", 4096, 1},
                 bad_range{"size past the end", 128, 129},
                 bad_range{"size past the end from 0", 0, 257},
                 bad_range{"size overflowing near SIZE_MAX", 8, max - 4},
                 bad_range{"offset near SIZE_MAX", max - 4, 8}}) {
    auto msg = expect_invalid(r.what, [&] { b.memset_zero(d, 3, r.offset, r.size); });
    BOOST_TEST(contains(msg, "pool 3"), r.what << ": " << msg);
    BOOST_TEST(contains(msg, "256"), r.what << ": " << msg); // the pool's size
    BOOST_TEST(contains(msg, std::to_string(r.offset)), r.what << ": " << msg);
  }
  BOOST_TEST(b.get_debug_info(d).to_string() == info);
  BOOST_TEST(b.get_used_memory(d) == used);

  // The edges are fine: a zero-length span at the end and the whole pool.
  BOOST_CHECK_NO_THROW(b.memset_zero(d, 3, 256, 0));
  BOOST_CHECK_NO_THROW(b.memset_zero(d, 3, 0, 256));
  BOOST_TEST(still_runs(b, d, 3, 64, "errors_memset") == 128.0);
}

BOOST_AUTO_TEST_CASE(test_errors_schedule_named_rejects_bad_specs) {
  backend b{two_devices(1)};
  auto d = b.get_device(0);
  b.alloc_pool(d, 1, 256, 64);
  bounded([&] { b.await(d); }, "await");
  auto info = b.get_debug_info(d).to_string();
  buffer_arg buf{buffer_loc{1, 0}, 256};

  auto unknown = expect_invalid("unknown kernel",
                                [&] { b.schedule_named(d, task_spec{"no_such_kernel", {}}); });
  BOOST_TEST(contains(unknown, "no_such_kernel"), unknown);

  auto kind = expect_invalid("wrong kind", [&] {
    b.schedule_named(d, task_spec{"fill", {std::string{"not a buffer"}, 1.0}});
  });
  BOOST_TEST(contains(kind, "fill"), kind);
  BOOST_TEST(contains(kind, "argument 0"), kind);
  BOOST_TEST(contains(kind, "buffer"), kind);
  BOOST_TEST(contains(kind, "string"), kind);

  auto kind2 = expect_invalid("float for a string", [&] {
    b.schedule_named(d, task_spec{"checksum", {buf, 1.5}});
  });
  BOOST_TEST(contains(kind2, "argument 1"), kind2);
  BOOST_TEST(contains(kind2, "string"), kind2);

  auto none = expect_invalid("monostate argument", [&] {
    b.schedule_named(d, task_spec{"fill", {buf, std::monostate{}}});
  });
  BOOST_TEST(contains(none, "argument 1"), none);

  auto few = expect_invalid("too few", [&] { b.schedule_named(d, task_spec{"fill", {buf}}); });
  BOOST_TEST(contains(few, "fill"), few);
  BOOST_TEST(contains(few, "2 arguments"), few);
  BOOST_TEST(contains(few, "got 1"), few);
  auto many = expect_invalid("too many", [&] {
    b.schedule_named(d, task_spec{"fill", {buf, 1.0, int64_t{3}}});
  });
  BOOST_TEST(contains(many, "got 3"), many);

  auto no_pool = expect_invalid("buffer in a missing pool", [&] {
    b.schedule_named(d, task_spec{"fill", {buffer_arg{buffer_loc{42, 0}, 16}, 1.0}});
  });
  BOOST_TEST(contains(no_pool, "pool 42"), no_pool);
  auto too_big = expect_invalid("buffer past the pool", [&] {
    b.schedule_named(d, task_spec{"fill", {buffer_arg{buffer_loc{1, 128}, 256}, 1.0}});
  });
  BOOST_TEST(contains(too_big, "pool 1"), too_big);
  // An offset near SIZE_MAX: offset + size wraps to a small number, which a
  // check written as `offset + size <= pool size` would let through; the
  // error names the span as asked, not as wrapped.
  constexpr auto max = std::numeric_limits<std::size_t>::max();
  auto wrapped = expect_invalid("buffer at an offset near SIZE_MAX", [&] {
    b.schedule_named(d, task_spec{"fill", {buffer_arg{buffer_loc{1, max - 7}, 16}, 1.0}});
  });
  BOOST_TEST(contains(wrapped, "pool 1"), wrapped);
  BOOST_TEST(contains(wrapped, "argument 0"), wrapped);
  BOOST_TEST(contains(wrapped, "16 bytes at offset " + std::to_string(max - 7)), wrapped);

  BOOST_TEST(b.get_debug_info(d).to_string() == info);
  BOOST_TEST(still_runs(b, d, 1, 64, "errors_specs") == 128.0);
}

BOOST_AUTO_TEST_CASE(test_errors_backend_options_reject_unknown_driver) {
  auto msg = expect_invalid("unknown driver",
                            [] { backend b{backend_options{.driver = "quantum_foam"}}; });
  BOOST_TEST(contains(msg, "quantum_foam"), msg);
  BOOST_TEST(contains(msg, "this build has: cpu, cuda, fake, fake_cuda"), msg); // the registered drivers
  auto neg = expect_invalid("negative device count",
                            [] { backend b{backend_options{.num_devices = -3}}; });
  BOOST_TEST(contains(neg, "-3"), neg);
  // A good backend still builds afterwards.
  backend ok{two_devices(1)};
  BOOST_TEST(ok.num_devices() == 1);
}
