// The CUDA driver (devices/cuda). By default against a fake of the CUDA
// runtime (devices/cuda/fake_cuda_api: streams on host threads), which lets
// the tests steer the "hardware": pause a device's streams so the runner's
// device-side waits can be seen, inject failed calls and sticky faults, count
// events, host callbacks and frees. With MULTIDEV_TEST_CUDA=real the same
// suite runs against the CUDA runtime (CTest's test_cuda_gpu, label gpu);
// with no GPU it exits 77, which CTest shows as skipped. Cases that steer
// the fake, or need more devices than the machine has, are skipped there
// through a precondition (`fake_only`, `needs_devices`), never by returning
// early: Boost.Test then reports them as skipped, with the reason, and
// tests/gpu/run_gpu_checks.sh counts them so (a case that returns early
// reads as passed although it checked nothing).
#define BOOST_TEST_MODULE cuda
#define BOOST_TEST_NO_MAIN
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "actors/backend_impl.hpp"
#include "devices/cuda/cuda_driver.hpp"
#include "devices/cuda/fake_cuda_api.hpp"
#include "multidev/multidev.hpp"
#include "test_support.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace multidev;
using namespace std::chrono_literals;
using namespace test_support;
namespace cuda = multidev::detail::cuda;

namespace {

bool real_mode() {
  auto* m = std::getenv("MULTIDEV_TEST_CUDA");
  return m && std::string{m} == "real";
}

/// The GPUs the real runtime reports (main() asks once, in real mode).
int real_devices = 0;

/// A CUDA backend: `n` fake GPUs, or at most `n` real ones.
backend_options cuda_opts(int n, std::size_t in_flight = 64) {
  return backend_options{.driver = real_mode() ? "cuda" : "fake_cuda",
                         .num_devices = n,
                         .max_in_flight = in_flight,
                         .scheduler_threads = 2};
}

cuda::fake_api* fake_of(backend& b) {
  return dynamic_cast<cuda::fake_api*>(detail::api_of(*b.impl().drv));
}

cuda::fake_api& the_fake(backend& b) {
  auto* f = fake_of(b);
  BOOST_TEST_REQUIRE(f != nullptr);
  return *f;
}

/// Skips the calling case (visibly) unless the fake runtime is in use.
struct fake_only {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r{!real_mode()};
    r.message() << "steers the fake CUDA runtime";
    return r;
  }
};

/// Skips the calling case (visibly) unless `n` CUDA devices are there: the
/// fake has as many as a case asks for, the real runtime the machine's.
struct needs_devices {
  int n;
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    int have = real_mode() ? real_devices : n;
    boost::test_tools::assertion_result r{have >= n};
    r.message() << "needs " << n << " CUDA devices, this machine has " << have;
    return r;
  }
};

task_spec spec(std::string kernel, std::vector<kernel_arg> args) {
  return task_spec{std::move(kernel), std::move(args)};
}

kernel_arg buf(int pool, std::size_t offset, std::size_t bytes) {
  return buffer_arg{{pool, offset}, bytes};
}

/// The same program of built-in kernels on device `d`: returns its checksum.
kernel_result kernel_program(backend& b, const device& d) {
  constexpr std::size_t n = 3000;
  constexpr std::size_t bytes = n * sizeof(float);
  b.alloc_pool(d, 1, 2 * bytes, 256);
  auto x = buf(1, 0, bytes);
  auto y = buf(1, bytes, bytes);
  b.schedule_named(d, spec("iota", {x, 0.25}));
  b.schedule_named(d, spec("scale", {x, 1.1}));
  b.schedule_named(d, spec("fill", {y, 0.3}));
  b.schedule_named(d, spec("axpy", {y, 0.7, x}));
  b.schedule_named(d, spec("iota", {x, -1000.5}));
  b.schedule_named(d, spec("axpy", {x, -3.3, y}));
  auto e = b.schedule_named(d, spec("checksum", {x, std::string{"program"}}));
  sync(b, e);
  auto r = b.result(d, "program");
  BOOST_TEST_REQUIRE(r.has_value());
  return *r;
}

std::vector<float> iota_floats(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = start + static_cast<float>(i);
  return v;
}

std::string failure_text(backend& b, const event& e) {
  try {
    bounded([&] { b.sync(e); });
  } catch (const device_error& err) {
    return err.what();
  }
  BOOST_FAIL("the event completed; a failure was expected");
  return {};
}

} // namespace

// -- Properties ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(properties_are_lazy_and_limits_are_the_minimum) {
  backend b{cuda_opts(2)};
  if (auto* f = fake_of(b))
    BOOST_TEST(f->stats().calls.count("get_device_count") == 0u); // nothing asked yet
  auto props = b.static_properties();
  BOOST_TEST(props.items().at(0).as_atom() == b.name());
  auto n = b.num_devices();
  BOOST_TEST_REQUIRE(n >= 1);
  auto* devs = props.find("devices");
  BOOST_TEST_REQUIRE(devs != nullptr);
  BOOST_TEST(devs->items().size() == static_cast<std::size_t>(n) + 1);
  for (std::size_t i = 1; i < devs->items().size(); ++i) {
    const auto& d = devs->items()[i];
    BOOST_TEST(field_of(d, "kind") == "cuda");
    BOOST_TEST(field_of(d, "compute_capability").find('.') != std::string::npos);
    BOOST_TEST(std::stoll(field_of(d, "multiprocessors")) > 0);
    BOOST_TEST(std::stoull(field_of(d, "memory")) > 0u);
    BOOST_TEST(std::stoll(field_of(d, "async_engines")) >= 0);
  }
  auto h = b.hardware_limits();
  BOOST_TEST_REQUIRE(h.max_threads_per_block.has_value());
  BOOST_TEST(*h.max_threads_per_block > 0);
  BOOST_TEST(h.max_block_dim_x.value_or(0) > 0);
  BOOST_TEST(h.max_grid_dim_x.value_or(0) > 0);
  BOOST_TEST(h.shared_memory_per_block.value_or(0) > 0);
  if (fake_of(b)) {
    // The fake's device 1 is the smaller one: the minimum is its.
    BOOST_TEST(*h.max_threads_per_block == 512);
    BOOST_TEST(*h.shared_memory_per_block == 32768);
  }
}

BOOST_AUTO_TEST_CASE(no_runtime_or_no_device_means_zero_devices_and_says_why) {
  auto fake = std::make_shared<cuda::fake_api>(2);
  fake->set_no_driver(true);
  auto drv = detail::make_cuda_driver(fake, std::nullopt);
  BOOST_TEST(drv->device_count() == 0);
  auto why = field_of(drv->properties(), "unavailable");
  BOOST_TEST(contains(why, "cudaErrorInsufficientDriver"), why);
  BOOST_TEST(contains(why, "CUDA driver version is insufficient"), why);
  BOOST_TEST(!drv->limits().max_threads_per_block.has_value());
  auto none = detail::make_cuda_driver(nullptr, std::nullopt);
  BOOST_TEST(none->device_count() == 0);
  BOOST_TEST(contains(field_of(none->properties(), "unavailable"), "no CUDA runtime"));
  // The real runtime here: devices, or none and the reason.
  backend real{backend_options{.driver = "cuda", .scheduler_threads = 2}};
  BOOST_TEST(real.name() == "multidev_cuda");
  if (real.num_devices() == 0) {
    auto reason = field_of(real.static_properties(), "unavailable");
    BOOST_TEST_MESSAGE("multidev_cuda here: " << reason);
    BOOST_TEST(reason.size() > 10u, reason);
    BOOST_CHECK_THROW(real.get_device(0), std::invalid_argument);
  }
}

// -- Kernels and copies ---------------------------------------------------------------

BOOST_AUTO_TEST_CASE(built_in_kernels_match_the_cpu_bit_for_bit) {
  backend cpu{backend_options{.num_devices = 1, .scheduler_threads = 2}};
  backend gpu{cuda_opts(1)};
  auto want = kernel_program(cpu, cpu.get_device(0));
  auto got = kernel_program(gpu, gpu.get_device(0));
  BOOST_TEST(got.count == want.count);
  BOOST_TEST(got.hash == want.hash);
  BOOST_TEST(got.sum == want.sum);
}

BOOST_AUTO_TEST_CASE(copies_between_host_and_device) {
  backend b{cuda_opts(1)};
  constexpr std::size_t n = 50000; // beyond one 64 KiB staging buffer
  auto t = node(1, "w", n);
  auto src = iota_floats(n, 0.5f);
  auto d0 = b.get_device(0);
  auto c0 = b.init_from_host(b.make_context(d0), t, std::as_bytes(std::span{src}));
  BOOST_TEST(read_back(b, c0, t) == src);
}

BOOST_AUTO_TEST_CASE(copies_peer_and_merge_buffer, *boost::unit_test::precondition(needs_devices{2})) {
  backend b{cuda_opts(2)};
  constexpr std::size_t n = 50000; // beyond one 64 KiB staging buffer
  auto t = node(1, "w", n);
  auto src = iota_floats(n, 0.5f);
  auto d0 = b.get_device(0);
  auto c0 = b.init_from_host(b.make_context(d0), t, std::as_bytes(std::span{src}));
  auto d1 = b.get_device(1);
  // Peer copy into d1's buffer.
  auto c1 = b.init_from_device(t, b.make_context(d1), c0);
  BOOST_TEST(read_back(b, c1, t) == src);
  // Into d1's merge buffer, then added to d1's node (which holds src).
  auto r = b.device_to_device(t, merge_buffer_use::copy, c1, c0);
  BOOST_TEST_REQUIRE(r.has_value());
  b.run(b.link(r->context, "add_from_merge", {t, t}));
  auto sum = read_back(b, c1, t);
  std::vector<float> twice(n);
  for (std::size_t i = 0; i < n; ++i)
    twice[i] = src[i] + src[i];
  BOOST_TEST(sum == twice);
  if (auto* f = fake_of(b))
    BOOST_TEST(f->stats().peer_copies >= 2u);
}

BOOST_AUTO_TEST_CASE(memset_zero_and_used_memory) {
  backend b{cuda_opts(1)};
  auto d = b.get_device(0);
  constexpr std::size_t bytes = std::size_t{1} << 20;
  b.alloc_pool(d, 3, bytes, 4096);
  BOOST_TEST(b.get_used_memory(d) >= bytes);
  b.schedule_named(d, spec("fill", {buf(3, 0, bytes), 2.0}));
  b.memset_zero(d, 3, 4096, 8192);
  auto e = b.schedule_named(d, spec("checksum", {buf(3, 0, bytes), std::string{"z"}}));
  sync(b, e);
  auto r = b.result(d, "z");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == 2.0 * static_cast<double>(bytes / 4 - 8192 / 4));
  auto info = b.get_debug_info(d);
  auto* c = info.find("cuda");
  BOOST_TEST_REQUIRE(c != nullptr, info.to_string());
  BOOST_TEST(std::stoull(field_of(*c, "pool_bytes")) >= bytes);
  BOOST_TEST(std::stoull(field_of(*c, "memory_total")) > 0u);
  BOOST_TEST(field_of(*c, "quarantined") == "no");
  if (auto* f = fake_of(b))
    BOOST_TEST(f->bytes_held(0) >= bytes);
}

BOOST_AUTO_TEST_CASE(a_kernel_without_a_cuda_version_is_refused_before_queuing) {
  register_kernel("host_only_twice", {.params = {arg_kind::buffer},
                                      .reads = {0},
                                      .writes = {0},
                                      .body =
                                        [](kernel_call& c) {
                                          for (auto& x : c.floats(0))
                                            x *= 2;
                                        }});
  backend b{cuda_opts(1)};
  auto d = b.get_device(0);
  b.alloc_pool(d, 1, 64, 64);
  auto before = scheduled_count(b, d);
  try {
    b.schedule_named(d, spec("host_only_twice", {buf(1, 0, 64)}));
    BOOST_FAIL("a host-only kernel was accepted on a CUDA device");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "host_only_twice"), e.what());
    BOOST_TEST(contains(e.what(), "no " + b.name() + " implementation"), e.what());
  }
  BOOST_TEST(scheduled_count(b, d) == before);
  sync(b, b.schedule_named(d, spec("fill", {buf(1, 0, 64), 1.0}))); // not failed
}

BOOST_AUTO_TEST_CASE(a_closure_launches_on_the_current_stream) {
  backend b{cuda_opts(1)};
  auto d = b.get_device(0);
  auto seen = std::make_shared<std::atomic<void*>>(nullptr);
  b.schedule_task(d, {"look", [seen] { seen->store(current_cuda_stream()); }});
  sync(b, b.all_work(d));
  BOOST_TEST(seen->load() != nullptr);
  BOOST_TEST(current_cuda_stream() == nullptr); // not on this thread
  backend cpu{backend_options{.num_devices = 1, .scheduler_threads = 2}};
  auto on_cpu = std::make_shared<std::atomic<bool>>(true);
  cpu.schedule_task(cpu.get_device(0),
                    {"look", [on_cpu] { on_cpu->store(current_cuda_stream() != nullptr); }});
  sync(cpu, cpu.all_work(cpu.get_device(0)));
  BOOST_TEST(!on_cpu->load());
}

// -- Events: in order, reused, fanned out, waited on the device ------------------------

BOOST_AUTO_TEST_CASE(completions_resolve_in_seq_order_and_events_are_reused) {
  backend b{cuda_opts(1, 16)};
  auto d = b.get_device(0);
  auto* f = fake_of(b);
  b.alloc_pool(d, 1, 4096, 256);
  if (f)
    f->pause(0);
  std::vector<event> evs;
  for (int i = 0; i < 400; ++i)
    evs.push_back(b.schedule_named(d, spec("fill", {buf(1, 0, 4096), double(i)})));
  if (f)
    f->resume(0);
  // At every moment the done events are a prefix of the schedule. Read from
  // the last to the first: once one is seen done, every earlier one, read
  // later, must be done too (being done is for good).
  bool prefix = true;
  while (!b.is_done(evs.back())) {
    bool later_done = false;
    for (auto e = evs.rbegin(); e != evs.rend(); ++e) {
      bool done = b.is_done(*e);
      if (!done && later_done)
        prefix = false;
      later_done |= done;
    }
  }
  sync(b, evs.back());
  BOOST_TEST(prefix);
  for (auto& e : evs)
    BOOST_TEST_REQUIRE((b.state(e) == event_state::done));
  if (f) {
    auto s = f->stats();
    // One event per item in flight at most, reused from the pool.
    BOOST_TEST(s.event_records >= 400u);
    BOOST_TEST(s.events_created <= 16u + 1u);
    // Completion is read from the events, not reported by host functions
    // (CUDA may run those of all streams one at a time; issue 43 point 3).
    BOOST_TEST(s.host_funcs_launched == 0u);
  }
}

BOOST_AUTO_TEST_CASE(a_wait_between_cuda_devices_is_ordered_on_the_device, *boost::unit_test::precondition(fake_only{})) {
  backend b{cuda_opts(2)};
  auto& f = the_fake(b);
  constexpr std::size_t n = 4096;
  auto t = node(1, "w", n);
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto c0 = b.alloc_node(b.make_context(d0), t);
  auto c1 = b.alloc_node(b.make_context(d1), t);
  sync(b, b.all_work(d0));
  sync(b, b.all_work(d1));
  f.pause(0); // device 0's work is submitted but does not run
  b.run(b.link(c0, "fill", {t, 4.0}));
  auto copy = b.device_to_device(t, merge_buffer_use::no, c1, c0);
  BOOST_TEST_REQUIRE(copy.has_value());
  auto done = b.all_work(d1);
  // Device 1's runner passed the wait without the host: its stream waits on
  // device 0's event, and the copy behind it is already launched.
  BOOST_TEST_REQUIRE(f.wait_until([](const cuda::fake_stats& s) {
    return s.stream_waits >= 1 && s.calls.count("memcpy_peer_async") && s.calls.at("memcpy_peer_async") >= 1;
  }));
  BOOST_TEST(!b.is_done(done));
  f.resume(0);
  auto got = read_back(b, c1, t);
  BOOST_TEST(got == std::vector<float>(n, 4.0f));
}

BOOST_AUTO_TEST_CASE(one_event_fans_out_to_many_waiting_devices, *boost::unit_test::precondition(needs_devices{2})) {
  backend b{cuda_opts(4)};
  auto* f = fake_of(b);
  int n_dev = b.num_devices();
  constexpr std::size_t n = 1024;
  auto t = node(1, "w", n);
  auto d0 = b.get_device(0);
  auto c0 = b.alloc_node(b.make_context(d0), t);
  std::vector<context> others;
  for (int i = 1; i < n_dev; ++i) {
    auto di = b.get_device(i);
    others.push_back(b.alloc_node(b.make_context(di), t));
    sync(b, b.all_work(di));
  }
  if (f)
    f->pause(0);
  b.run(b.link(c0, "iota", {t, 3.0}));
  for (auto& c : others)
    b.device_to_device(t, merge_buffer_use::no, c, c0);
  if (f) {
    auto waiters = static_cast<uint64_t>(n_dev - 1);
    BOOST_TEST_REQUIRE(f->wait_until(
      [waiters](const cuda::fake_stats& s) { return s.stream_waits >= waiters; }));
    f->resume(0);
  }
  auto want = iota_floats(n, 3.0f);
  for (auto& c : others)
    BOOST_TEST(read_back(b, c, t) == want);
}

// -- Waits across kinds: a CPU backend and a CUDA one in one process -----------------

BOOST_AUTO_TEST_CASE(waits_between_cpu_and_cuda_devices_go_both_ways) {
  backend cpu{backend_options{.num_devices = 1, .scheduler_threads = 2}};
  backend gpu{cuda_opts(1)};
  auto cd = cpu.get_device(0);
  auto gd = gpu.get_device(0);
  constexpr std::size_t n = 2048;
  auto t = node(1, "w", n);
  auto gc = gpu.alloc_node(gpu.make_context(gd), t);
  sync(gpu, gpu.all_work(gd));
  // CPU -> CUDA: the copy from host memory waits for the CPU task that
  // writes it (held on a latch until the copy is queued).
  std::vector<float> host(n, 0.0f);
  auto release = std::make_shared<latch_gate>();
  // No Boost.Test assertion on the runner thread: Boost.Test is not
  // thread-safe, and one there raced the main thread's (a task failed with
  // basic_string::_M_create). A latch that never opens fails the task.
  cpu.schedule_task(cd, {"write host", [release, &host] {
                           if (!release->wait())
                             throw std::runtime_error("the latch was never opened");
                           std::fill(host.begin(), host.end(), 7.0f);
                         }});
  gpu.will_wait_for(gc, cpu.all_work(cd));
  gpu.from_host(gc, t, std::as_bytes(std::span{host}));
  release->open();
  BOOST_TEST(read_back(gpu, gc, t) == std::vector<float>(n, 7.0f));
  // CUDA -> CPU: the CPU task reads what the device copied out.
  gpu.run(gpu.link(gc, "fill", {t, 3.0}));
  std::vector<float> out(n, 0.0f);
  gpu.to_host(gc, t, std::as_writable_bytes(std::span{out}));
  auto cc = cpu.make_context(cd);
  cpu.will_wait_for(cc, gpu.all_work(gd));
  auto seen = std::make_shared<std::atomic<float>>(-1.0f);
  cpu.schedule_task(cd, {"read host", [seen, &out] { seen->store(out[n - 1]); }});
  sync(cpu, cpu.all_work(cd));
  BOOST_TEST(seen->load() == 3.0f);
}

// A task that syncs on an earlier item of its own device, which sits behind
// a wait the driver ordered on the stream (issue 36 point 8). The task's
// work runs on the runner as it is submitted, and the runner alone settled
// such waits: the earlier item never resolved (finished 0, in flight 0).
// The task's sync is bounded (10 s) so a regression fails instead of
// hanging; `timed = false` syncs without a deadline (then the test's own
// 30 s bound ends a regression).
BOOST_TEST_DECORATOR(*boost::unit_test::precondition(fake_only{}))
BOOST_DATA_TEST_CASE(a_task_syncs_on_its_own_item_behind_a_wait_on_the_device,
                     boost::unit_test::data::make({true, false}), timed) {
  backend b{cuda_opts(2)};
  auto& f = the_fake(b);
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  sync(b, b.all_work(d0));
  sync(b, b.all_work(d1));
  f.pause(0); // device 0's item is submitted but does not run
  auto producer = b.schedule_named(d0, spec("spin_ns", {int64_t{0}}));
  b.will_wait_for(b.make_context(d1), producer);
  auto behind = b.schedule_named(d1, spec("spin_ns", {int64_t{0}}));
  auto started = std::make_shared<latch_gate>();
  auto outcome = std::make_shared<std::string>("did not run");
  b.schedule_task(d1, {"sync on an earlier item", [&b, behind, started, outcome, timed] {
                         started->open();
                         try {
                           if (timed)
                             b.sync(behind, std::chrono::steady_clock::now() + 10s);
                           else
                             b.sync(behind);
                           *outcome = "done";
                         } catch (const std::exception& e) {
                           *outcome = e.what();
                         }
                       }});
  auto task_done = b.all_work(d1);
  // The task starts only once the runner passed the wait, which device 0
  // (paused) cannot have opened: the driver ordered it on the stream.
  BOOST_TEST_REQUIRE(started->wait());
  BOOST_TEST(f.stats().stream_waits >= 1u);
  BOOST_TEST(!b.is_done(behind));
  f.resume(0);
  sync(b, task_done);
  BOOST_TEST(*outcome == "done");
  BOOST_TEST(b.is_done(behind));
  BOOST_TEST(b.is_done(producer));
}

// -- Errors ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_failed_call_fails_its_item_naming_the_cuda_error, *boost::unit_test::precondition(fake_only{})) {
  backend b{cuda_opts(1)};
  auto& f = the_fake(b);
  auto d = b.get_device(0);
  constexpr std::size_t n = 256;
  auto t = node(1, "w", n);
  auto c = b.alloc_node(b.make_context(d), t);
  sync(b, b.all_work(d));
  std::vector<float> host(n, 1.0f);
  f.fail_next("memcpy_async", cuda::code::invalid_value);
  b.from_host(c, t, std::as_bytes(std::span{host}));
  auto text = failure_text(b, b.all_work(d));
  BOOST_TEST(contains(text, "cudaMemcpyAsync"), text);
  BOOST_TEST(contains(text, "cudaErrorInvalidValue"), text);
  BOOST_TEST(contains(text, "invalid argument"), text);
  // Not sticky: the device recovers and works.
  BOOST_TEST(b.recover(d));
  f.fail_next("launch_fill", cuda::code::launch_out_of_resources);
  text = failure_text(b, b.run(b.link(c, "fill", {t, 1.0})));
  BOOST_TEST(contains(text, "fill kernel launch"), text);
  BOOST_TEST(contains(text, "cudaErrorLaunchOutOfResources"), text);
  BOOST_TEST(b.recover(d));
  b.run(b.link(c, "fill", {t, 5.0}));
  BOOST_TEST(read_back(b, c, t) == std::vector<float>(n, 5.0f));
  BOOST_TEST(field_of(*b.get_debug_info(d).find("cuda"), "quarantined") == "no");
}

BOOST_AUTO_TEST_CASE(a_sticky_error_quarantines_every_device, *boost::unit_test::precondition(fake_only{})) {
  backend b{cuda_opts(2)};
  auto& f = the_fake(b);
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  b.alloc_pool(d0, 1, 4096, 256);
  b.alloc_pool(d1, 1, 4096, 256);
  sync(b, b.all_work(d0));
  // The fault shows only when the kernel runs, after the item was fully
  // submitted (its event recorded): nothing else is submitted, and only the
  // completion thread, asking the item's event, can find the error.
  auto recorded = f.stats().event_records;
  f.pause(0);
  auto only = b.schedule_named(d0, spec("fill", {buf(1, 0, 4096), 1.0}));
  BOOST_TEST_REQUIRE(f.wait_until(
    [&](const cuda::fake_stats& s) { return s.event_records > recorded; }));
  f.fail_kernel_sticky(0, cuda::code::illegal_address);
  f.resume(0);
  auto text = failure_text(b, only);
  BOOST_TEST(contains(text, "quarantined"), text);
  BOOST_TEST(contains(text, "cudaErrorIllegalAddress"), text);
  BOOST_TEST(contains(text, "an illegal memory access was encountered"), text);
  // Recovering the device does not bring the context back.
  b.recover(d0);
  text = failure_text(b, b.schedule_named(d0, spec("fill", {buf(1, 0, 4096), 3.0})));
  BOOST_TEST(contains(text, "quarantined"), text);
  BOOST_TEST(contains(field_of(*b.get_debug_info(d0).find("cuda"), "quarantined"),
                      "cudaErrorIllegalAddress"));
  BOOST_CHECK_THROW(b.alloc_pool(d0, 2, 64, 64), std::exception);
  // Issue 43 point 7: CUDA's sticky errors are the process's, not the
  // device's. The other device is quarantined at once, before it runs
  // anything (this case used to check that it worked on: on a GPU, every
  // later call of the process reports the error).
  auto other = field_of(*b.get_debug_info(d1).find("cuda"), "quarantined");
  BOOST_TEST(contains(other, "cudaErrorIllegalAddress"), other);
  BOOST_TEST(contains(other, "cuda device 0"), other);
  text = failure_text(b, b.schedule_named(d1, spec("fill", {buf(1, 0, 4096), 6.0})));
  BOOST_TEST(contains(text, "quarantined"), text);
}

BOOST_AUTO_TEST_CASE(work_ordered_behind_a_failed_producer_is_never_done, *boost::unit_test::precondition(fake_only{})) {
  backend b{cuda_opts(2)};
  auto& f = the_fake(b);
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  b.alloc_pool(d0, 1, 4096, 256);
  b.alloc_pool(d1, 1, 4096, 256);
  sync(b, b.all_work(d0));
  sync(b, b.all_work(d1));
  auto launched = f.stats().kernels_launched;
  f.pause(0);
  auto produced = b.schedule_named(d0, spec("fill", {buf(1, 0, 4096), 1.0}));
  b.will_wait_for(b.make_context(d1), produced);
  auto consumed = b.schedule_named(d1, spec("fill", {buf(1, 0, 4096), 2.0}));
  // Device 1's fill is launched behind a device-side wait before device 0 ran.
  BOOST_TEST_REQUIRE(f.wait_until([&](const cuda::fake_stats& s) {
    return s.stream_waits >= 1 && s.kernels_launched >= launched + 2;
  }));
  f.fail_kernel_sticky(0, cuda::code::illegal_address);
  f.resume(0);
  auto text = failure_text(b, consumed);
  BOOST_TEST(contains(text, "cudaErrorIllegalAddress"), text);
  try {
    b.sync(consumed);
  } catch (const device_error& e) {
    BOOST_TEST(e.origin_device() == b.get_name(d0)); // the provenance names the producer
  }
  BOOST_TEST((b.state(produced) == event_state::failed));
  BOOST_TEST((b.state(consumed) == event_state::failed));
}

// -- Issue 43: the driver as a real GPU sees it ------------------------------------------

namespace {
/// How `e` ended within `limit`: "done", "in flight after N s", or the failure.
std::string ended(backend& b, const event& e, std::chrono::seconds limit = 10s) {
  try {
    b.sync(e, limit);
    return "done";
  } catch (const timeout_error&) {
    return "still in flight after " + std::to_string(limit.count()) + " s";
  } catch (const std::exception& err) {
    return err.what();
  }
}

/// Destroys `b` (bounded: a hang fails the run).
void destroy(std::unique_ptr<backend>& b) {
  bounded([&] { b.reset(); }, "destroying the backend");
}
} // namespace

// Point 1: a status the stream reports that `is_sticky` did not list
// (cudaErrorContained, 226, or any code this build does not know) was
// ignored by the watchdog; the stream runs no more host functions, so the
// item stayed in flight forever and the stream's destructor waited for it.
BOOST_TEST_DECORATOR(*boost::unit_test::precondition(fake_only{}))
BOOST_DATA_TEST_CASE(a_fatal_error_missing_from_the_sticky_list_fails_the_work,
                     boost::unit_test::data::make({cuda::code::contained, 1234}), error) {
  auto b = std::make_unique<backend>(cuda_opts(1));
  auto& f = the_fake(*b);
  auto d = b->get_device(0);
  b->alloc_pool(d, 1, 4096, 256);
  sync(*b, b->all_work(d));
  f.fail_kernel_sticky(0, error);
  auto text = ended(*b, b->schedule_named(d, spec("fill", {buf(1, 0, 4096), 1.0})));
  BOOST_TEST(contains(text, "quarantined"), text);
  BOOST_TEST(contains(text, f.error_name(error)), text);
  destroy(b);
}

// Point 2: `floats()` checked the size, never the address: a float kernel
// at byte offset 2 ran, and on a GPU its access is cudaErrorMisalignedAddress,
// sticky for the process. Refused when bound, naming device, pool, offset.
BOOST_AUTO_TEST_CASE(a_misaligned_float_buffer_is_refused_when_bound) {
  backend b{cuda_opts(1)};
  auto d = b.get_device(0);
  b.alloc_pool(d, 1, 8192, 256);
  try {
    auto e = b.schedule_named(d, spec("fill", {buf(1, 2, 4096), 5.0}));
    BOOST_ERROR("a fill at byte offset 2 was accepted; it ended: " << ended(b, e));
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), b.get_name(d)), e.what());
    BOOST_TEST(contains(e.what(), "pool 1"), e.what());
    BOOST_TEST(contains(e.what(), "offset 2"), e.what());
  }
  BOOST_TEST(field_of(*b.get_debug_info(d).find("cuda"), "quarantined") == "no");
  b.recover(d);
  b.schedule_named(d, spec("fill", {buf(1, 0, 8192), 3.0}));
  auto e = b.schedule_named(d, spec("checksum", {buf(1, 0, 8192), std::string{"after"}}));
  sync(b, e);
  BOOST_TEST(b.result(d, "after").value().sum == 3.0 * 2048);
}

// Point 4: a launch's status is `cudaGetLastError` after it, which returns
// any earlier uncleared error of the thread: one a closure left behind
// failed the next kernel of the device.
BOOST_AUTO_TEST_CASE(a_launch_does_not_report_an_earlier_error_of_its_thread, *boost::unit_test::precondition(fake_only{})) {
  backend b{cuda_opts(1)};
  auto* api = detail::api_of(*b.impl().drv);
  auto d = b.get_device(0);
  b.alloc_pool(d, 1, 4096, 256);
  // A user's closure whose own CUDA call fails, and which ignores it.
  b.schedule_task(d, {"a failed call left behind", [api] {
                        (void)api->memcpy_async(nullptr, nullptr, 16, current_cuda_stream());
                      }});
  b.schedule_named(d, spec("fill", {buf(1, 0, 4096), 2.0}));
  auto e = b.schedule_named(d, spec("checksum", {buf(1, 0, 4096), std::string{"sum"}}));
  auto text = ended(b, e);
  BOOST_TEST(text == "done");
  if (text == "done")
    BOOST_TEST(b.result(d, "sum").value().sum == 2.0 * 1024);
}

// Point 4: a failed cudaFreeAsync was ignored without being cleared: the
// thread's next launch reported it.
BOOST_AUTO_TEST_CASE(a_failed_free_leaves_no_error_behind, *boost::unit_test::precondition(fake_only{})) {
  auto fake = std::make_shared<cuda::fake_api>(1);
  auto drv = detail::make_cuda_driver(fake, std::nullopt);
  BOOST_TEST_REQUIRE(drv->device_count() == 1);
  auto a = drv->allocate(0, 1024, 256, std::nullopt);
  fake->fail_next("free_async", cuda::code::invalid_value);
  a.reset();
  BOOST_TEST(fake->get_last_error() == cuda::code::success);
}

// Point 5: a closure that selects another device left the runner there:
// the item's event was created on that device, its record failed and the
// item failed (on a GPU: retired early, its host functions still running).
BOOST_AUTO_TEST_CASE(a_closure_that_selects_another_device_does_not_break_its_item, *boost::unit_test::precondition(needs_devices{2})) {
  backend b{cuda_opts(2)};
  auto* api = detail::api_of(*b.impl().drv);
  auto d0 = b.get_device(0);
  b.schedule_task(d0, {"select device 1", [api] {
                         if (api->set_device(1) != cuda::code::success)
                           throw std::runtime_error("cudaSetDevice(1) failed");
                       }});
  BOOST_TEST(ended(b, b.all_work(d0)) == "done");
  b.recover(d0);
  b.alloc_pool(d0, 1, 4096, 256);
  b.schedule_named(d0, spec("fill", {buf(1, 0, 4096), 4.0}));
  auto e = b.schedule_named(d0, spec("checksum", {buf(1, 0, 4096), std::string{"sum"}}));
  BOOST_TEST(ended(b, e) == "done");
  BOOST_TEST(b.result(d0, "sum").value_or(kernel_result{}).sum == 4.0 * 1024);
}

// Point 5: `allocate`, `release` and `debug_info` selected the device they
// work on and left the calling thread there.
BOOST_AUTO_TEST_CASE(driver_calls_leave_the_callers_device_as_it_was, *boost::unit_test::precondition(fake_only{})) {
  auto fake = std::make_shared<cuda::fake_api>(2);
  auto drv = detail::make_cuda_driver(fake, std::nullopt);
  BOOST_TEST_REQUIRE(drv->device_count() == 2);
  auto current = [&] {
    int dev = -1;
    BOOST_TEST_REQUIRE(fake->get_device(&dev) == cuda::code::success);
    return dev;
  };
  BOOST_TEST_REQUIRE(fake->set_device(1) == cuda::code::success);
  auto a = drv->allocate(0, 1024, 256, std::nullopt);
  BOOST_TEST(current() == 1, "after allocate on device 0");
  BOOST_TEST_REQUIRE(fake->set_device(1) == cuda::code::success);
  (void)drv->debug_info(0);
  BOOST_TEST(current() == 1, "after debug_info of device 0");
  BOOST_TEST_REQUIRE(fake->set_device(1) == cuda::code::success);
  a.reset();
  BOOST_TEST(current() == 1, "after the release of device 0's allocation");
}

// Point 7: closing a stream waited for it without a bound (a kernel that
// never ends, a wait on an event never recorded: the backend's destructor
// hung). Now, after the drain bound without a completion, the device is
// quarantined, its item fails, and what the stream may still use is kept.
BOOST_AUTO_TEST_CASE(closing_a_stream_that_never_drains_is_bounded, *boost::unit_test::precondition(fake_only{})) {
  auto b = std::make_unique<backend>(cuda_opts(1));
  auto& f = the_fake(*b);
  auto keep = b->impl().drv; // the fake outlives the backend
  detail::set_cuda_drain_bound(*keep, 200ms);
  auto d = b->get_device(0);
  b->alloc_pool(d, 1, 4096, 256);
  sync(*b, b->all_work(d));
  auto recorded = f.stats().event_records;
  f.pause(0); // the item is submitted and never runs
  auto stuck = b->schedule_named(d, spec("fill", {buf(1, 0, 4096), 1.0}));
  BOOST_TEST_REQUIRE(f.wait_until(
    [&](const cuda::fake_stats& s) { return s.event_records > recorded; }));
  (void)stuck;
  destroy(b);
  auto s = f.stats();
  BOOST_TEST(s.streams_created == s.streams_destroyed + 1); // kept: it may still run
  f.resume(0); // the fake runs it when it goes; the abandoned host function returns
}

// Point 6: each item in flight got its own pinned staging buffer, its size
// rounded up to a power of two, none freed before the stream closed (eight
// 9 MiB copies queued pinned 128 MiB). Now a ring of pinned chunks per
// device, reused in stream order, bounds it.
BOOST_AUTO_TEST_CASE(pinned_staging_memory_is_bounded_whatever_is_in_flight, *boost::unit_test::precondition(fake_only{})) {
  backend b{cuda_opts(1)};
  auto& f = the_fake(b);
  auto d = b.get_device(0);
  constexpr std::size_t n = (std::size_t{9} << 20) / sizeof(float); // more than one chunk
  constexpr std::size_t bound = detail::cuda_staging_chunk * detail::cuda_staging_chunks;
  auto t = node(1, "w", n);
  auto c = b.alloc_node(b.make_context(d), t);
  auto src = iota_floats(n, 0.5f);
  sync(b, b.all_work(d));
  auto copies = f.stats().calls["memcpy_async"];
  f.pause(0); // every copy is submitted before any runs
  constexpr int in_flight = 8;
  for (int i = 0; i < in_flight; ++i)
    BOOST_TEST_REQUIRE(b.from_host(c, t, std::as_bytes(std::span{src})));
  BOOST_TEST_REQUIRE(f.wait_until([&](const cuda::fake_stats& s) {
    return s.calls.count("memcpy_async") && s.calls.at("memcpy_async") >= copies + in_flight;
  }));
  auto pinned = f.stats().pinned_bytes_held;
  auto staging = std::stoull(field_of(*b.get_debug_info(d).find("cuda"), "staging_bytes"));
  f.resume(0);
  BOOST_TEST(read_back(b, c, t) == src);
  // And the stream's one pinned word, which it waits on for staged chunks.
  BOOST_TEST(pinned <= bound + sizeof(uint32_t));
  BOOST_TEST(staging <= bound);
  BOOST_TEST(std::stoull(field_of(*b.get_debug_info(d).find("cuda"), "staging_bytes")) <= bound);
}

// Point 3: items completed in host functions (cudaLaunchHostFunc), which
// CUDA may serialize across all streams: a device whose host function runs
// long (a 64 MiB staging copy; here a user's host function held on a latch)
// held back every other device's completions. Completion is detected by the
// items' events on the stream's own thread.
namespace {
struct held_host_function {
  latch_gate started;
  latch_gate release;
  static void run(void* self) {
    auto* h = static_cast<held_host_function*>(self);
    h->started.open();
    (void)h->release.wait();
  }

  /// Schedules on `d` a task that launches `run` on its stream (through the
  /// driver's API): once `started`, it holds the host functions until
  /// `release`.
  static std::shared_ptr<held_host_function> launch_on(backend& b, const device& d) {
    auto* api = detail::api_of(*b.impl().drv);
    auto held = std::make_shared<held_host_function>();
    b.schedule_task(d, {"a host function held on a latch", [api, held] {
                          if (api->launch_host_func(current_cuda_stream(), &held_host_function::run,
                                                    held.get()) != cuda::code::success)
                            throw std::runtime_error("cudaLaunchHostFunc failed");
                        }});
    return held;
  }
};
} // namespace

BOOST_AUTO_TEST_CASE(a_long_host_function_on_one_device_does_not_hold_back_another, *boost::unit_test::precondition(fake_only{})) {
  backend b{cuda_opts(2)};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  b.alloc_pool(d1, 1, 4096, 256);
  sync(b, b.all_work(d1));
  auto held = held_host_function::launch_on(b, d0);
  auto d0_done = b.all_work(d0);
  BOOST_TEST_REQUIRE(held->started.wait()); // it runs, and holds the host functions
  b.schedule_named(d1, spec("fill", {buf(1, 0, 4096), 5.0}));
  auto text = ended(b, b.all_work(d1), 5s);
  held->release.open();
  BOOST_TEST(text == "done");
  BOOST_TEST(ended(b, d0_done) == "done");
}

// Point 3, second half: the pageable<->pinned staging copy of every host
// copy, and checksum's sums, ran in host functions, which CUDA may run one
// at a time for all streams: one device's long host function (a 64 MiB
// staging copy; here a user's host function held on a latch) held back
// every other device's host copies. They run on each stream's staging
// thread now, and the stream waits for a staged chunk on a pinned word.
BOOST_AUTO_TEST_CASE(host_copies_and_checksums_do_not_wait_for_another_devices_host_function, *boost::unit_test::precondition(fake_only{})) {
  // Two and a half chunks: the ring's chunks are reused within one copy.
  constexpr std::size_t n = detail::cuda_staging_chunk * 5 / 2 / sizeof(float);
  auto src = iota_floats(n, 0.5f);
  std::vector<float> out(n, 0.0f); // outlives the backend, which ends the copies
  backend b{cuda_opts(2)};
  auto& f = the_fake(b);
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto t = node(1, "w", n);
  auto c = b.alloc_node(b.make_context(d1), t);
  b.alloc_pool(d1, 2, 4096, 256);
  sync(b, b.all_work(d1));
  auto launched = f.stats().host_funcs_launched;
  auto held = held_host_function::launch_on(b, d0);
  auto d0_done = b.all_work(d0);
  BOOST_TEST_REQUIRE(held->started.wait()); // it runs, and holds the host functions
  // Host to device, device to host, and a checksum, all on device 1.
  bool sent = b.from_host(c, t, std::as_bytes(std::span{src}));
  bool asked = b.to_host(c, t, std::as_writable_bytes(std::span{out}));
  b.schedule_named(d1, spec("fill", {buf(2, 0, 4096), 5.0}));
  b.schedule_named(d1, spec("checksum", {buf(2, 0, 4096), std::string{"sum"}}));
  auto text = ended(b, b.all_work(d1), 5s);
  held->release.open();
  BOOST_TEST_REQUIRE(ended(b, b.all_work(d1)) == "done"); // late, if not in time
  BOOST_TEST(sent);
  BOOST_TEST(asked);
  BOOST_TEST(text == "done");
  BOOST_TEST(ended(b, d0_done) == "done");
  BOOST_TEST(out == src);
  auto sum = b.result(d1, "sum");
  BOOST_TEST_REQUIRE(sum.has_value());
  BOOST_TEST(sum->sum == 5.0 * 1024);
  // No host function did any of it: the user's is the only one.
  auto s = f.stats();
  BOOST_TEST(s.host_funcs_launched == launched + 1);
  BOOST_TEST(s.value_waits_run >= 3u); // the stream waited for staged chunks
}

// A copy to the host does not hold its stream until the staging thread has
// copied it out: a device that waits for it on the device must wait for
// that too (the staging word), not only for the item's event. Here device
// 0's staging thread still has two chunks of a large copy to copy out when
// the small copy's item event is reached; device 1 waits for that item and
// then copies the small buffer back from the host. (Without the word's wait
// it read the zeros, or not, depending on the two threads' pace.)
BOOST_AUTO_TEST_CASE(a_device_waiting_for_a_copy_to_the_host_reads_what_it_wrote, *boost::unit_test::precondition(fake_only{})) {
  constexpr std::size_t big_n = detail::cuda_staging_chunk * 4 / sizeof(float);
  constexpr std::size_t n = 4096;
  std::vector<float> big(big_n, 0.0f); // outlive the backend
  std::vector<float> small(n, 0.0f);
  backend b{cuda_opts(2)};
  auto& f = the_fake(b);
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto tb = node(1, "big", big_n);
  auto ts = node(2, "small", n);
  auto c0 = b.alloc_node(b.alloc_node(b.make_context(d0), tb), ts);
  auto c1 = b.alloc_node(b.make_context(d1), ts);
  sync(b, b.all_work(d0));
  sync(b, b.all_work(d1));
  f.pause(0); // all of it is submitted before device 0 runs any
  b.run(b.link(c0, "fill", {tb, 1.0}));
  b.run(b.link(c0, "fill", {ts, 6.0}));
  BOOST_TEST_REQUIRE(b.to_host(c0, tb, std::as_writable_bytes(std::span{big})));
  BOOST_TEST_REQUIRE(b.to_host(c0, ts, std::as_writable_bytes(std::span{small})));
  b.will_wait_for(c1, b.all_work(d0));
  BOOST_TEST_REQUIRE(b.from_host(c1, ts, std::as_bytes(std::span{small})));
  BOOST_TEST_REQUIRE(f.wait_until([](const cuda::fake_stats& s) { return s.stream_waits >= 1; }));
  f.resume(0);
  BOOST_TEST(read_back(b, c1, ts) == std::vector<float>(n, 6.0f));
  sync(b, b.all_work(d0));
  BOOST_TEST(big == std::vector<float>(big_n, 1.0f));
}

// -- The fake runtime is not kinder than CUDA (issue 43) -------------------------------------

BOOST_AUTO_TEST_CASE(the_fake_faults_a_misaligned_kernel_and_breaks_every_device, *boost::unit_test::precondition(fake_only{})) {
  cuda::fake_api f{2};
  cuda::stream_t s = nullptr;
  void* p = nullptr;
  BOOST_TEST_REQUIRE(f.stream_create(&s) == cuda::code::success);
  BOOST_TEST_REQUIRE(f.malloc_async(&p, 4096, s) == cuda::code::success);
  auto* odd = reinterpret_cast<float*>(static_cast<std::byte*>(p) + 2);
  BOOST_TEST(f.launch_fill(odd, 16, 1.0f, s) == cuda::code::success); // faults when it runs
  BOOST_TEST(f.stream_synchronize(s) == cuda::code::misaligned_address);
  BOOST_TEST_REQUIRE(f.set_device(1) == cuda::code::success);
  cuda::stream_t other = nullptr;
  BOOST_TEST(f.stream_create(&other) == cuda::code::misaligned_address); // the process's
  BOOST_TEST(f.stats().kernels_run == 0u);
}

BOOST_AUTO_TEST_CASE(the_fake_reuses_freed_memory_and_reports_earlier_errors_at_launch, *boost::unit_test::precondition(fake_only{})) {
  cuda::fake_api f{1};
  cuda::stream_t s = nullptr;
  BOOST_TEST_REQUIRE(f.stream_create(&s) == cuda::code::success);
  void* a = nullptr;
  BOOST_TEST_REQUIRE(f.malloc_async(&a, 1000, s) == cuda::code::success);
  BOOST_TEST_REQUIRE(f.free_async(a, s) == cuda::code::success);
  BOOST_TEST_REQUIRE(f.stream_synchronize(s) == cuda::code::success);
  void* b = nullptr;
  BOOST_TEST_REQUIRE(f.malloc_async(&b, 1000, s) == cuda::code::success);
  BOOST_TEST(b == a); // the pool hands the freed block out again, as it is
  // A failed call's error stays the thread's until cudaGetLastError, and a
  // launch (<<<>>> then cudaGetLastError) reports it.
  BOOST_TEST(f.memcpy_async(nullptr, nullptr, 16, s) == cuda::code::invalid_value);
  BOOST_TEST(f.launch_fill(static_cast<float*>(b), 16, 1.0f, s) == cuda::code::invalid_value);
  BOOST_TEST(f.launch_fill(static_cast<float*>(b), 16, 1.0f, s) == cuda::code::success);
  BOOST_TEST(f.stream_synchronize(s) == cuda::code::success);
  BOOST_TEST(f.free_async(b, s) == cuda::code::success);
  BOOST_TEST(f.stream_destroy(s) == cuda::code::success);
}

BOOST_AUTO_TEST_CASE(the_fake_blocks_a_launch_while_its_stream_is_full, *boost::unit_test::precondition(fake_only{})) {
  cuda::fake_api f{1};
  cuda::stream_t s = nullptr;
  void* p = nullptr;
  BOOST_TEST_REQUIRE(f.stream_create(&s) == cuda::code::success);
  BOOST_TEST_REQUIRE(f.malloc_async(&p, 4096, s) == cuda::code::success);
  BOOST_TEST_REQUIRE(f.stream_synchronize(s) == cuda::code::success);
  f.set_queue_limit(2);
  f.pause(0);
  std::atomic<int> launched{0};
  std::thread launcher{[&] {
    for (int i = 0; i < 3; ++i)
      if (f.memset_async(p, i, 4096, s) == cuda::code::success)
        ++launched;
  }};
  // Two queue; the third waits for room (no Boost.Test on the launcher).
  bool blocked = f.wait_until([](const cuda::fake_stats& st) { return st.launches_blocked >= 1; });
  BOOST_TEST(blocked);
  BOOST_TEST(launched.load() == 2);
  f.resume(0);
  launcher.join();
  BOOST_TEST(launched.load() == 3);
  BOOST_TEST(f.stream_synchronize(s) == cuda::code::success);
  BOOST_TEST(f.stats().memsets == 3u);
}

// -- Memory is given back ------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(pools_freed_in_host_callbacks_are_freed_later, *boost::unit_test::precondition(fake_only{})) {
  std::shared_ptr<detail::driver> keep;
  cuda::fake_api* f = nullptr;
  {
    backend b{cuda_opts(2)};
    keep = b.impl().drv; // the fake outlives the backend
    f = &the_fake(b);
    auto d0 = b.get_device(0);
    auto d1 = b.get_device(1);
    constexpr std::size_t n = 20000;
    auto t = node(1, "w", n);
    auto c0 = b.alloc_node(b.make_context(d0), t);
    auto c1 = b.alloc_node(b.make_context(d1), t);
    for (int round = 0; round < 20; ++round) {
      b.alloc_pool(d0, 7, 1 << 16, 256);
      b.schedule_named(d0, spec("fill", {buf(7, 0, 1 << 16), double(round)}));
      b.free_pool(d0, 7); // released by the host callback of the fill
      b.run(b.link(c0, "iota", {t, double(round)}));
      b.device_to_device(t, merge_buffer_use::no, c1, c0);
    }
    BOOST_TEST(read_back(b, c1, t) == iota_floats(n, 19.0f));
  }
  auto s = f->stats();
  BOOST_TEST(s.mallocs >= 22u);
  BOOST_TEST(s.bytes_held == 0u);
  BOOST_TEST(s.pinned_bytes_held == 0u);
  BOOST_TEST(s.streams_destroyed == s.streams_created);
  BOOST_TEST(s.events_destroyed == s.events_created);
  BOOST_TEST(s.calls_in_host_funcs == 0u); // frees asked for there were deferred
}

// -- Sizes that cannot be allocated ----------------------------------------------------------

// Issue 36 point 1: `max(size, 1) + extra` (the over-allocation for an
// alignment above 256) wrapped around for a size near SIZE_MAX, and the
// driver handed out a block of a few bytes.
BOOST_AUTO_TEST_CASE(a_size_whose_over_allocation_overflows_is_refused, *boost::unit_test::precondition(fake_only{})) {
  auto fake = std::make_shared<cuda::fake_api>(1);
  auto drv = detail::make_cuda_driver(fake, std::nullopt);
  BOOST_TEST_REQUIRE(drv->device_count() == 1);
  constexpr auto max = std::numeric_limits<std::size_t>::max();
  BOOST_CHECK_THROW(drv->allocate(0, max - 10, 1024, std::nullopt), std::bad_alloc);
  BOOST_CHECK_THROW(drv->allocate(0, max, 4096, std::nullopt), std::bad_alloc);
  BOOST_CHECK_THROW(drv->allocate(0, 16, std::size_t{1} << 63, std::nullopt), std::bad_alloc);
  BOOST_TEST(fake->stats().bytes_held == 0u);
  auto a = drv->allocate(0, 100, 1024, std::nullopt);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(a->base()) % 1024 == 0u);
}

BOOST_AUTO_TEST_CASE(alloc_pool_of_a_size_no_device_holds_leaves_the_device_as_it_was) {
  backend b{cuda_opts(1)};
  auto d = b.get_device(0);
  b.alloc_pool(d, 1, 4096, 256);
  constexpr auto max = std::numeric_limits<std::size_t>::max();
  auto info = b.get_debug_info(d).to_string();
  auto used = b.get_used_memory(d);
  for (int pool : {2, 1}) {
    try {
      b.alloc_pool(d, pool, max - 10, 1024);
      BOOST_FAIL("alloc_pool of " << max - 10 << " bytes on pool " << pool << " was accepted");
    } catch (const std::invalid_argument& e) {
      BOOST_TEST(contains(e.what(), "pool " + std::to_string(pool)), e.what());
      BOOST_TEST(contains(e.what(), b.get_name(d)), e.what());
    }
  }
  BOOST_TEST(b.get_debug_info(d).to_string() == info);
  BOOST_TEST(b.get_used_memory(d) == used);
  b.schedule_named(d, spec("fill", {buf(1, 0, 4096), 1.0}));
  auto e = b.schedule_named(d, spec("checksum", {buf(1, 0, 4096), std::string{"after"}}));
  sync(b, e);
  auto r = b.result(d, "after");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == 1024.0);
}

// -- Entry point: the real runtime without a GPU skips ----------------------------------------

int main(int argc, char* argv[]) {
  if (real_mode()) {
    backend probe{backend_options{.driver = "cuda", .scheduler_threads = 1}};
    real_devices = probe.num_devices();
    if (real_devices == 0) {
      std::cout << "SKIPPED: no CUDA device here ("
                << field_of(probe.static_properties(), "unavailable") << ")\n";
      return 77;
    }
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
