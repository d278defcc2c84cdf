// gpu_checks: what the CUDA driver must do on a GPU when things go wrong,
// one check per process (a device fault poisons the whole process's CUDA
// context, so no check may follow one in the same process):
//
//   fault       a kernel writes through a bad pointer (launched by a closure
//               on the device's stream): the item fails naming the CUDA
//               error within `fault_bound`, the device is quarantined, later
//               work on it fails as promptly, and destroying the backend
//               returns within `shutdown_bound`.
//   misaligned  a `fill` of a buffer at byte offset 2 of its pool is refused
//               (when scheduled, or its item fails without running the
//               kernel): the device is not quarantined and aligned work
//               afterwards computes the right sum. Without the refusal the
//               kernel's float access at an odd address raises
//               cudaErrorMisalignedAddress, sticky for the process (issue 43
//               point 2): the driver refuses it when the buffer is bound.
//   staging     16 host-to-device copies of 64 MiB queued at once behind a
//               1 s kernel: the driver's pinned staging memory
//               (`staging_bytes` in the device's debug info, sampled until
//               the copies are done) stays within `--staging-limit-mib`
//               (default: the driver's bound, a ring of
//               `cuda_staging_chunks` chunks of `cuda_staging_chunk` bytes,
//               16 MiB; docs/design.md), and the node holds the bytes copied.
//
// Usage: gpu_checks --check NAME [--fake] [--staging-limit-mib N]
//        gpu_checks --list       the checks' names
//        gpu_checks --devices    the CUDA backend's properties, then
//                                `cuda devices: N` (exit 77 when N is 0)
// `--fake` runs the check on the fake CUDA runtime (driver fake_cuda; its
// fault is injected with fail_kernel_sticky instead of a bad pointer), which
// tries the check's own logic where there is no GPU. Output: the steps, then
// one verdict line `check: NAME: passed|failed|skipped: WHY`, which
// tests/gpu/run_gpu_checks.sh counts. Exit status 0 passed, 1 failed, 77
// skipped (no CUDA device, or a build without the CUDA Toolkit), 2 bad usage.
// Every wait is bounded: a check that hangs fails, naming its step, after
// `check_bound`, and exits without running destructors.
#include "actors/backend_impl.hpp"
#include "devices/cuda/cuda_api.hpp"
#include "devices/cuda/cuda_driver.hpp"
#include "devices/cuda/fake_cuda_api.hpp"
#include "multidev/cuda.hpp"
#include "multidev/multidev.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cuda = multidev::detail::cuda;
using namespace multidev;
using namespace std::chrono_literals;

namespace {

using clock_type = std::chrono::steady_clock;

/// How long the fault may take to fail its item, and later work.
constexpr auto fault_bound = 10s;
/// How long destroying a backend may take.
constexpr auto shutdown_bound = 20s;
/// How long a whole check may take before it counts as hung.
constexpr auto check_bound = 120s;

const std::vector<std::string> check_names{"fault", "misaligned", "staging"};

std::string check_name = "?";

/// The verdict line (see the file comment); exits with its status at once,
/// without running destructors: a backend whose device hit a CUDA error may
/// not drain, and its threads must not meet static destruction.
[[noreturn]] void verdict(const char* what, const std::string& why) {
  std::cout << std::flush;
  std::printf("check: %s: %s: %s\n", check_name.c_str(), what, why.c_str());
  std::fflush(nullptr);
  std::_Exit(std::strcmp(what, "passed") == 0 ? 0 : std::strcmp(what, "skipped") == 0 ? 77 : 1);
}
[[noreturn]] void fail(const std::string& why) { verdict("failed", why); }

/// What the check is doing, for the verdict of one that hangs.
std::atomic<const char*> step{"starting"};

void at(const char* what) {
  step.store(what);
  std::printf("gpu_checks: %s: %s\n", check_name.c_str(), what);
  std::fflush(stdout);
}

/// Fails the check when it has not ended `check_bound` after it started.
void start_watchdog() {
  std::thread{[] {
    std::this_thread::sleep_for(check_bound);
    fail("did not finish within " + std::to_string(check_bound.count()) + " s, hung at: " +
         step.load());
  }}.detach();
}

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

std::string ms(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f ms", x);
  return buf;
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string field_of(const sexp& info, const char* key) {
  auto* f = info.find(key);
  if (!f || f->items().size() < 2 || !f->items()[1].is_atom())
    return "<missing " + std::string{key} + ">";
  return f->items()[1].as_atom();
}

/// The `cuda` section of `d`'s debug info.
sexp cuda_info(const backend& b, const device& d) {
  auto info = b.get_debug_info(d);
  auto* c = info.find("cuda");
  if (!c)
    fail("the debug info of " + b.get_name(d) + " has no cuda section: " + info.to_string());
  return *c;
}

/// How `e` ended within `limit`: "done", or the failure's message; a
/// timeout fails the check.
std::string outcome(const backend& b, const event& e, std::chrono::seconds limit,
                    const std::string& what) {
  try {
    b.sync(e, limit);
    return "done";
  } catch (const timeout_error& err) {
    fail(what + " was not over within " + std::to_string(limit.count()) + " s: " + err.what());
  } catch (const std::exception& err) {
    return err.what();
  }
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

task_spec spec(std::string kernel, std::vector<kernel_arg> args) {
  return task_spec{std::move(kernel), std::move(args)};
}

kernel_arg buf(int pool, std::size_t offset, std::size_t bytes) {
  return buffer_arg{{pool, offset}, bytes};
}

/// The checksum of `bytes` bytes at `offset` of `pool` on `d`, within the bound.
double sum_of(backend& b, const device& d, int pool, std::size_t offset, std::size_t bytes) {
  auto e = b.schedule_named(d, spec("checksum", {buf(pool, offset, bytes), std::string{"sum"}}));
  auto how = outcome(b, e, fault_bound, "a checksum");
  if (how != "done")
    fail("a checksum failed: " + how);
  auto r = b.result(d, "sum");
  if (!r)
    fail("a checksum left no result");
  return r->sum;
}

/// Destroys `b` on another thread; fails the check when that takes longer
/// than `shutdown_bound`. Returns how long it took.
double destroy_bounded(std::unique_ptr<backend> b) {
  auto t0 = clock_type::now();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread t{[&] {
    b.reset();
    std::lock_guard lk{mu};
    done = true;
    cv.notify_all();
  }};
  std::unique_lock lk{mu};
  if (!cv.wait_for(lk, shutdown_bound, [&] { return done; }))
    fail("destroying the backend did not return within " +
         std::to_string(shutdown_bound.count()) + " s");
  lk.unlock();
  t.join();
  return ms_since(t0);
}

// -- fault ----------------------------------------------------------------------------

void check_fault(bool fake) {
  auto b = std::make_unique<backend>(backend_options{
    .driver = fake ? "fake_cuda" : "cuda", .num_devices = 1, .scheduler_threads = 2});
  auto d = b->get_device(0);
  auto* api = detail::api_of(*b->impl().drv);
  auto* fake_api = dynamic_cast<cuda::fake_api*>(api);
  at("a fill before the fault");
  b->alloc_pool(d, 1, 4096, 256);
  b->schedule_named(d, spec("fill", {buf(1, 0, 4096), 1.0}));
  if (auto s = sum_of(*b, d, 1, 0, 4096); s != 1024.0)
    fail("the fill before the fault summed to " + std::to_string(s) + ", expected 1024");

  at("the fault");
  auto t0 = clock_type::now();
  event faulted;
  if (fake_api) {
    // The fake's stand-in for a bad pointer: its next kernel turns the
    // device sticky when the stream reaches it.
    fake_api->fail_kernel_sticky(0, cuda::code::illegal_address);
    faulted = b->schedule_named(d, spec("fill", {buf(1, 0, 4096), 2.0}));
  } else {
    // A kernel that writes 4 MiB from address 0x100: an illegal address.
    b->schedule_task(d, {"write through a bad pointer", [api] {
                           auto st = api->launch_fill(reinterpret_cast<float*>(0x100),
                                                      std::size_t{1} << 20, 3.0f,
                                                      current_cuda_stream());
                           if (st != cuda::code::success)
                             throw std::runtime_error("the faulting launch itself failed: " +
                                                      api->error_name(st));
                         }});
    faulted = b->all_work(d);
  }
  auto how = outcome(*b, faulted, fault_bound, "the faulting item");
  double fail_ms = ms_since(t0);
  if (how == "done")
    fail("the faulting item completed as done");
  if (!contains(how, "cudaErrorIllegalAddress"))
    fail("the faulting item failed without naming cudaErrorIllegalAddress: " + how);
  std::printf("gpu_checks: fault: the item failed after %s: %s\n", ms(fail_ms).c_str(),
              how.c_str());

  at("the device is quarantined");
  auto cause = field_of(cuda_info(*b, d), "quarantined");
  if (cause == "no" || !contains(cause, "cudaError"))
    fail("the device is not quarantined after the fault (quarantined: " + cause + ")");

  at("later work on the device");
  auto t1 = clock_type::now();
  b->recover(d);
  std::string later;
  try {
    later = outcome(*b, b->schedule_named(d, spec("fill", {buf(1, 0, 4096), 4.0})), fault_bound,
                    "a fill after the fault");
  } catch (const std::exception& e) {
    later = e.what(); // refused when scheduled
  }
  double later_ms = ms_since(t1);
  if (later == "done")
    fail("a fill after the fault completed on the quarantined device");
  if (!contains(later, "quarantined"))
    fail("a fill after the fault failed without saying the device is quarantined: " + later);

  at("destroying the backend");
  double down_ms = destroy_bounded(std::move(b));
  verdict("passed", "the faulting item failed in " + ms(fail_ms) + ", the device is quarantined (" +
                      cause + "), later work failed in " + ms(later_ms) +
                      ", the backend was destroyed in " + ms(down_ms));
}

// -- misaligned -------------------------------------------------------------------------

void check_misaligned(bool fake) {
  auto b = std::make_unique<backend>(backend_options{
    .driver = fake ? "fake_cuda" : "cuda", .num_devices = 1, .scheduler_threads = 2});
  auto d = b->get_device(0);
  constexpr std::size_t bytes = 8192;
  b->alloc_pool(d, 1, bytes, 256);

  at("a fill at byte offset 2");
  std::string how;
  try {
    how = outcome(*b, b->schedule_named(d, spec("fill", {buf(1, 2, 4096), 5.0})), fault_bound,
                  "the misaligned fill");
    if (how == "done")
      fail("a fill of floats at byte offset 2 was accepted and completed");
  } catch (const std::invalid_argument& e) {
    how = std::string{"refused when scheduled: "} + e.what();
  }
  std::printf("gpu_checks: misaligned: %s\n", how.c_str());
  auto cause = field_of(cuda_info(*b, d), "quarantined");
  if (cause != "no")
    fail("the misaligned fill quarantined the device: " + cause);
  if (contains(how, "cudaError"))
    fail("the misaligned fill was launched and failed on the device: " + how);

  at("aligned work afterwards");
  b->recover(d);
  b->schedule_named(d, spec("fill", {buf(1, 0, bytes), 3.0}));
  auto s = sum_of(*b, d, 1, 0, bytes);
  if (s != 3.0 * (bytes / sizeof(float)))
    fail("an aligned fill after the refusal summed to " + std::to_string(s) + ", expected " +
         std::to_string(3.0 * (bytes / sizeof(float))));
  destroy_bounded(std::move(b));
  verdict("passed", how);
}

// -- staging ------------------------------------------------------------------------------

void check_staging(bool fake, std::size_t limit) {
  constexpr int copies = 16;
  constexpr std::size_t bytes = std::size_t{64} << 20;
  auto b = std::make_unique<backend>(backend_options{
    .driver = fake ? "fake_cuda" : "cuda", .num_devices = 1, .scheduler_threads = 2});
  auto d = b->get_device(0);
  tnode t{1, "staged", bytes};
  auto c = b->alloc_node(b->make_context(d), t);
  std::vector<float> src(bytes / sizeof(float));
  for (std::size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<float>(i % 1000003) + 0.5f;
  b->sync(b->all_work(d), fault_bound);

  at("16 copies of 64 MiB behind a 1 s kernel");
  b->schedule_named(d, spec("spin_ns", {int64_t{1'000'000'000}}));
  for (int i = 0; i < copies; ++i)
    if (!b->from_host(c, t, std::as_bytes(std::span{src})))
      fail("from_host: the context does not hold the node");
  auto last = b->all_work(d);
  std::size_t peak = 0;
  long most_in_flight = 0;
  auto t0 = clock_type::now();
  while (!b->is_done(last) && clock_type::now() - t0 < 60s) {
    auto info = cuda_info(*b, d);
    peak = std::max<std::size_t>(peak, std::stoull(field_of(info, "staging_bytes")));
    most_in_flight = std::max(most_in_flight, std::stol(field_of(info, "in_flight")));
    std::this_thread::sleep_for(1ms); // sampling, not synchronizing
  }
  auto how = outcome(*b, last, 30s, "the copies");
  if (how != "done")
    fail("the copies failed: " + how);
  auto after = std::stoull(field_of(cuda_info(*b, d), "staging_bytes"));
  peak = std::max<std::size_t>(peak, after);

  at("reading the node back");
  std::vector<float> got(src.size(), -1.0f);
  if (!b->to_host(c, t, std::as_writable_bytes(std::span{got})))
    fail("to_host: the context does not hold the node");
  b->sync(b->all_work(d), fault_bound);
  if (std::memcmp(got.data(), src.data(), bytes) != 0)
    fail("the node does not hold the bytes copied");
  destroy_bounded(std::move(b));

  auto what = "peak staging " + mib(peak) + " (" + mib(after) + " held after), limit " +
              mib(limit) + ", for " + std::to_string(copies) + " concurrent copies of " +
              mib(bytes) + ", at most " + std::to_string(most_in_flight) + " items in flight";
  if (peak > limit)
    fail(what);
  verdict("passed", what);
}

int usage(const std::string& why) {
  std::cerr << "gpu_checks: " << why
            << "\nusage: gpu_checks --check fault|misaligned|staging [--fake] "
               "[--staging-limit-mib N]\n       gpu_checks --list\n       gpu_checks --devices\n";
  return 2;
}

} // namespace

int main(int argc, char* argv[]) {
  bool fake = false;
  std::optional<std::string> which;
  std::size_t staging_limit = detail::cuda_staging_chunk * detail::cuda_staging_chunks;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--list") {
      for (const auto& n : check_names)
        std::cout << n << "\n";
      return 0;
    } else if (a == "--devices") {
      backend b{backend_options{.driver = "cuda", .scheduler_threads = 1}};
      int n = b.num_devices();
      std::cout << b.static_properties().to_string() << "\n";
      if (n > 0)
        std::cout << "hardware limits (the minimum over the devices): "
                  << to_sexp(b.hardware_limits()).to_string() << "\n";
      std::cout << "cuda devices: " << n << std::endl;
      return n > 0 ? 0 : 77;
    } else if (a == "--check" && i + 1 < argc) {
      which = argv[++i];
    } else if (a == "--fake") {
      fake = true;
    } else if (a == "--staging-limit-mib" && i + 1 < argc) {
      char* end = nullptr;
      long n = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || n < 1 || n > (1 << 20))
        return usage("--staging-limit-mib must be a whole number from 1 to 1048576");
      staging_limit = static_cast<std::size_t>(n) << 20;
    } else {
      return usage("unexpected argument '" + a + "'");
    }
  }
  if (!which || std::find(check_names.begin(), check_names.end(), *which) == check_names.end())
    return usage("--check needs one of fault, misaligned, staging");
  check_name = *which;

  if (!fake) {
    if (!cuda::built_with_cuda())
      verdict("skipped", "a build without the CUDA Toolkit");
    backend probe{backend_options{.driver = "cuda", .scheduler_threads = 1}};
    if (probe.num_devices() == 0)
      verdict("skipped", "no CUDA device (" + field_of(probe.static_properties(), "unavailable") +
                           ")");
  }
  start_watchdog();
  try {
    if (*which == "fault")
      check_fault(fake);
    else if (*which == "misaligned")
      check_misaligned(fake);
    else
      check_staging(fake, staging_limit);
  } catch (const std::exception& e) {
    fail(std::string{"at "} + step.load() + ": " + e.what());
  }
  fail("ended without a verdict");
}
