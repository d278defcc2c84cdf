// bench_cuda: the CUDA driver's figures, each beside its raw-CUDA baseline
// measured in the same run (white-box: the baselines call the runtime through
// `cuda::real_api()`, the very layer the driver uses).
//
//   kernel_chain                  a chain of 1-float `fill`s on device 0, each
//                                 behind the one before in the device's
//                                 order, vs the same kernels on a raw stream
//                                 where each waits (cudaStreamWaitEvent) for
//                                 the event recorded after the one before, as
//                                 the driver records one per item (us per
//                                 kernel; lower is better; as many kernels
//                                 per sample as take ~0.2 s at multidev's
//                                 pace, 100 to 20000).
//   event_hop                     a ping-pong between devices 0 and 1 through
//                                 will_wait_for, one 1-float `fill` per hop,
//                                 vs the same kernels on two raw streams
//                                 chained by cudaEventRecord +
//                                 cudaStreamWaitEvent (us per hop; lower is
//                                 better; as many hops per sample as take
//                                 ~0.2 s at multidev's pace, 100 to 5000).
//                                 Needs 2 GPUs.
//   copy_host_to_device_<size>    from_host of a node of 4 KiB, 256 KiB, 4 MiB
//   copy_device_to_host_<size>    and 64 MiB from ordinary (pageable) memory,
//                                 and to_host into it, vs cudaMemcpyAsync
//                                 from and to pinned memory (GB/s; higher is
//                                 better; as many copies per sample as move
//                                 ~256 MiB, 4 to 1000). The data is checked:
//                                 after the timing, what from_host wrote reads
//                                 back equal, and what to_host brings is what
//                                 a `fill` wrote on the device.
//   copy_device_to_device_64MiB   device_to_device (merge_buffer_use::no) of a
//                                 64 MiB node from device 0 to 1 vs
//                                 cudaMemcpyPeerAsync (GB/s; higher is
//                                 better). Needs 2 GPUs.
//
// Like `multidev bench` (tools/bench.cpp): one unrecorded warm-up round, then
// multidev and its baseline alternate, `--repeats` rounds (default 5), and
// the medians are reported; ratio = multidev / baseline. Each figure ends in
// one verdict line, `check: NAME: passed|failed|skipped: WHY`, which
// tests/gpu/run_gpu_checks.sh counts: passed when measured (and, for the
// copies, the data checked out), skipped when it needs more GPUs than the
// machine has, failed when the data is wrong. Without a GPU (or in a build
// without the CUDA Toolkit) every figure is skipped, saying why, and the
// exit status is 77; 1 when a figure failed, else 0. `--json FILE` writes
// the figures measured as a JSON array of {name, multidev, baseline, unit,
// ratio, better}. Every status the raw runtime returns is checked: a failure
// prints the call and the error's name and exits 1. `--fake` runs it all
// on the fake CUDA runtime (driver fake_cuda, two devices; the baselines
// through the same fake): its figures mean nothing, it tries the program's
// own logic and data checks where there is no GPU.
#include "actors/backend_impl.hpp"
#include "devices/cuda/cuda_api.hpp"
#include "devices/cuda/cuda_driver.hpp"
#include "multidev/multidev.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace cuda = multidev::detail::cuda;
using namespace multidev;

namespace {

using clock_type = std::chrono::steady_clock;

/// Kernels per kernel_chain sample and hops per event_hop sample: as many as
/// take about `sample_s` at multidev's pace (measured once, first), within
/// these bounds, so that a slow step cannot make the run long.
constexpr int min_steps = 100;
constexpr int max_chain = 20000;
constexpr int max_hops = 5000;
constexpr double sample_s = 0.2;
/// The sizes of the host copies; the device-to-device copy is of the last.
constexpr std::size_t copy_sizes[] = {std::size_t{4} << 10, std::size_t{256} << 10,
                                      std::size_t{4} << 20, std::size_t{64} << 20};
constexpr std::size_t max_copy_bytes = std::size_t{64} << 20;
/// Bytes a bandwidth sample moves (copies back to back, then one
/// synchronize), in 4 to 1000 copies.
constexpr std::size_t sample_bytes = std::size_t{256} << 20;

int copies_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>(sample_bytes / bytes, 4, 1000));
}

std::string size_label(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20))
    return std::to_string(bytes >> 20) + "MiB";
  return std::to_string(bytes >> 10) + "KiB";
}

/// Every figure, in the order measured (the names the verdict lines use).
std::vector<std::string> figure_names() {
  std::vector<std::string> names{"kernel_chain", "event_hop"};
  for (auto bytes : copy_sizes) {
    names.push_back("copy_host_to_device_" + size_label(bytes));
    names.push_back("copy_device_to_host_" + size_label(bytes));
  }
  names.push_back("copy_device_to_device_" + size_label(max_copy_bytes));
  return names;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

/// One warm-up call of each, then `repeats` rounds alternating them; the
/// medians of what each returns, in order.
std::pair<double, double> medians(int repeats, const std::function<double()>& ours,
                                  const std::function<double()>& base) {
  ours();
  base();
  std::vector<double> xs;
  std::vector<double> ys;
  for (int i = 0; i < repeats; ++i) {
    xs.push_back(ours());
    ys.push_back(base());
  }
  return {median(std::move(xs)), median(std::move(ys))};
}

/// Exits at once, without running destructors: a backend whose device hit a
/// CUDA error may not drain, and its threads must not meet static
/// destruction.
[[noreturn]] void die(const std::string& what) {
  std::cout << std::flush;
  std::cerr << "bench_cuda: " << what << std::endl;
  std::fflush(nullptr);
  std::_Exit(1);
}

/// The raw runtime, every status checked.
struct raw {
  cuda::api& api;

  void check(cuda::status s, const char* call) const {
    if (s != cuda::code::success)
      die(std::string{call} + " failed: " + api.error_name(s) + " (" + api.error_string(s) +
          ")");
  }
};

struct figure {
  std::string name;
  double multidev = 0;
  std::string baseline_label;
  double baseline = 0;
  std::string unit;
  std::string better; // "lower" or "higher"
  double ratio() const { return multidev / baseline; }
};

/// The figures measured and the verdict of each (see the file comment).
struct verdicts {
  std::vector<figure> figures;
  int failed = 0;

  void line(const std::string& name, const char* verdict, const std::string& why) {
    std::printf("check: %s: %s: %s\n", name.c_str(), verdict, why.c_str());
    std::fflush(stdout);
  }
  /// `f` measured; `wrong` says what was wrong with the data, if anything.
  void measured(figure f, const std::string& wrong = {}) {
    std::printf("%s: multidev %.2f %s, %s %.2f %s, ratio %.2f (%s is better)\n",
                f.name.c_str(), f.multidev, f.unit.c_str(), f.baseline_label.c_str(),
                f.baseline, f.unit.c_str(), f.ratio(), f.better.c_str());
    char ratio[64];
    std::snprintf(ratio, sizeof ratio, "ratio %.2f", f.ratio());
    if (wrong.empty()) {
      line(f.name, "passed", ratio);
    } else {
      ++failed;
      line(f.name, "failed", wrong + " (" + ratio + ")");
    }
    figures.push_back(std::move(f));
  }
  void skipped(const std::string& name, const std::string& why) { line(name, "skipped", why); }
};

void write_json(const std::string& path, const std::vector<figure>& fs) {
  auto arr = nlohmann::ordered_json::array();
  for (const auto& f : fs)
    arr.push_back(nlohmann::ordered_json{{"name", f.name},
                                 {"multidev", f.multidev},
                                 {"baseline", f.baseline},
                                 {"unit", f.unit},
                                 {"ratio", f.ratio()},
                                 {"better", f.better}});
  std::ofstream out{path};
  out << arr.dump(2) << "\n";
  out.close();
  if (!out)
    die("cannot write " + path);
}

std::string unavailable_reason(const backend& b) {
  auto props = b.static_properties();
  if (auto* f = props.find("unavailable"); f && f->items().size() >= 2 && f->items()[1].is_atom())
    return f->items()[1].as_atom();
  return "no CUDA device (" + props.to_string() + ")";
}

/// Steps per sample: as many as take `sample_s` at `us_per_step`, within bounds.
int steps_for(double us_per_step, int most) {
  return static_cast<int>(
    std::clamp(sample_s * 1e6 / std::max(us_per_step, 1e-3), double{min_steps}, static_cast<double>(most)));
}

// -- kernel_chain ---------------------------------------------------------------------

/// us per kernel of `n` runs of `r` (1-float fills on one device, each behind
/// the one before).
double multidev_chain_us(backend& b, const routine& r, int n) {
  auto t0 = clock_type::now();
  event last = b.run(r);
  for (int i = 1; i < n; ++i)
    last = b.run(r);
  b.sync(last);
  return seconds_since(t0) * 1e6 / n;
}

/// The same chain on a raw stream of device 0: each fill waits for the
/// event recorded after the one before.
struct raw_chain {
  raw rt;
  cuda::stream_t s{};
  cuda::event_t e{};
  float* p{};

  explicit raw_chain(raw r) : rt(r) {
    rt.check(rt.api.set_device(0), "cudaSetDevice");
    rt.check(rt.api.stream_create(&s), "cudaStreamCreateWithFlags");
    rt.check(rt.api.event_create(&e), "cudaEventCreateWithFlags");
    void* q = nullptr;
    rt.check(rt.api.malloc_async(&q, sizeof(float), s), "cudaMallocAsync");
    p = static_cast<float*>(q);
    rt.check(rt.api.stream_synchronize(s), "cudaStreamSynchronize");
  }
  ~raw_chain() {
    rt.check(rt.api.set_device(0), "cudaSetDevice");
    rt.check(rt.api.free_async(p, s), "cudaFreeAsync");
    rt.check(rt.api.stream_synchronize(s), "cudaStreamSynchronize");
    rt.check(rt.api.event_destroy(e), "cudaEventDestroy");
    rt.check(rt.api.stream_destroy(s), "cudaStreamDestroy");
  }

  double us_per_kernel(int n) {
    auto t0 = clock_type::now();
    rt.check(rt.api.set_device(0), "cudaSetDevice");
    for (int i = 0; i < n; ++i) {
      if (i > 0)
        rt.check(rt.api.stream_wait_event(s, e), "cudaStreamWaitEvent");
      rt.check(rt.api.launch_fill(p, 1, static_cast<float>(i), s), "fill kernel launch");
      rt.check(rt.api.event_record(e, s), "cudaEventRecord");
    }
    rt.check(rt.api.stream_synchronize(s), "cudaStreamSynchronize");
    return seconds_since(t0) * 1e6 / n;
  }
};

void kernel_chain(backend& b, raw rt, int repeats, verdicts& v) {
  auto d = b.get_device(0);
  tnode t{10, "chain", sizeof(float)};
  auto c = b.alloc_node(b.make_context(d), t);
  routine r = b.link(c, "fill", {t, 1.0});
  b.sync(b.all_work(d));
  raw_chain base{rt};
  multidev_chain_us(b, r, min_steps); // calibration, also warms up
  int n = steps_for(multidev_chain_us(b, r, min_steps), max_chain);
  base.us_per_kernel(min_steps);
  auto [ours, theirs] = medians(
    repeats, [&] { return multidev_chain_us(b, r, n); }, [&] { return base.us_per_kernel(n); });
  std::printf("bench_cuda: %d kernels per kernel_chain sample\n", n);
  b.sync_device(d);
  v.measured({"kernel_chain", ours, "cudaStreamWaitEvent chain on a raw stream", theirs, "us",
              "lower"});
}

// -- event_hop ----------------------------------------------------------------------

/// us per hop of a ping-pong of 1-float fills between `c[0]` and `c[1]`, each
/// waiting for the previous one through will_wait_for.
double multidev_hop_us(backend& b, const context (&c)[2], const routine (&r)[2], int hops) {
  auto t0 = clock_type::now();
  event last = b.run(r[0]);
  for (int i = 1; i < hops; ++i) {
    int d = i % 2;
    b.will_wait_for(c[d], last);
    last = b.run(r[d]);
  }
  b.sync(last);
  return seconds_since(t0) * 1e6 / hops;
}

/// The same chain on two raw streams: record an event after each fill, make
/// the other stream wait for it, fill there.
struct raw_hops {
  raw rt;
  cuda::stream_t s[2]{};
  cuda::event_t e[2]{};
  float* p[2]{};

  explicit raw_hops(raw r) : rt(r) {
    for (int d = 0; d < 2; ++d) {
      rt.check(rt.api.set_device(d), "cudaSetDevice");
      rt.check(rt.api.stream_create(&s[d]), "cudaStreamCreateWithFlags");
      rt.check(rt.api.event_create(&e[d]), "cudaEventCreateWithFlags");
      void* q = nullptr;
      rt.check(rt.api.malloc_async(&q, sizeof(float), s[d]), "cudaMallocAsync");
      p[d] = static_cast<float*>(q);
      rt.check(rt.api.stream_synchronize(s[d]), "cudaStreamSynchronize");
    }
  }
  ~raw_hops() {
    for (int d = 0; d < 2; ++d) {
      rt.check(rt.api.set_device(d), "cudaSetDevice");
      rt.check(rt.api.free_async(p[d], s[d]), "cudaFreeAsync");
      rt.check(rt.api.stream_synchronize(s[d]), "cudaStreamSynchronize");
      rt.check(rt.api.event_destroy(e[d]), "cudaEventDestroy");
      rt.check(rt.api.stream_destroy(s[d]), "cudaStreamDestroy");
    }
  }

  double us_per_hop(int hops) {
    auto t0 = clock_type::now();
    for (int i = 0; i < hops; ++i) {
      int d = i % 2;
      rt.check(rt.api.set_device(d), "cudaSetDevice");
      if (i > 0)
        rt.check(rt.api.stream_wait_event(s[d], e[1 - d]), "cudaStreamWaitEvent");
      rt.check(rt.api.launch_fill(p[d], 1, static_cast<float>(i), s[d]), "fill kernel launch");
      rt.check(rt.api.event_record(e[d], s[d]), "cudaEventRecord");
    }
    // The last hop waits (on the device) for all before it; both streams
    // are synchronized all the same.
    for (int d : {(hops - 1) % 2, hops % 2}) {
      rt.check(rt.api.set_device(d), "cudaSetDevice");
      rt.check(rt.api.stream_synchronize(s[d]), "cudaStreamSynchronize");
    }
    return seconds_since(t0) * 1e6 / hops;
  }
};

void event_hop(backend& b, raw rt, int repeats, verdicts& v) {
  device d[2] = {b.get_device(0), b.get_device(1)};
  tnode t[2] = {tnode{1, "hop0", sizeof(float)}, tnode{2, "hop1", sizeof(float)}};
  context c[2] = {b.alloc_node(b.make_context(d[0]), t[0]),
                  b.alloc_node(b.make_context(d[1]), t[1])};
  routine r[2] = {b.link(c[0], "fill", {t[0], 1.0}), b.link(c[1], "fill", {t[1], 2.0})};
  b.sync(b.all_work(d[0]));
  b.sync(b.all_work(d[1]));
  raw_hops base{rt};
  // Calibration (also warms up both): how many hops a sample takes.
  multidev_hop_us(b, c, r, min_steps);
  int hops = steps_for(multidev_hop_us(b, c, r, min_steps), max_hops);
  base.us_per_hop(min_steps);
  auto [ours, theirs] = medians(
    repeats, [&] { return multidev_hop_us(b, c, r, hops); },
    [&] { return base.us_per_hop(hops); });
  std::printf("bench_cuda: %d hops per event_hop sample\n", hops);
  b.sync_device(d[0]);
  b.sync_device(d[1]);
  v.measured({"event_hop", ours, "cudaStreamWaitEvent loop", theirs, "us", "lower"});
}

// -- copies -----------------------------------------------------------------------------

double gbps(std::size_t bytes, int copies, double secs) {
  return static_cast<double>(bytes) * copies / secs / 1e9;
}

/// The raw side of the copies: pinned host memory, a buffer on device 0 and
/// (with 2 devices) one on device 1, a stream on each device.
struct raw_copies {
  raw rt;
  int devices;
  void* pinned = nullptr;
  void* buf[2]{};
  cuda::stream_t s[2]{};

  raw_copies(raw r, int n) : rt(r), devices(std::min(n, 2)) {
    rt.check(rt.api.malloc_host(&pinned, max_copy_bytes), "cudaMallocHost");
    std::memset(pinned, 0x5a, max_copy_bytes); // touches every page
    for (int d = 0; d < devices; ++d) {
      rt.check(rt.api.set_device(d), "cudaSetDevice");
      // As the driver does (idempotent): keep freed memory and let peers
      // reach the pool, so the peer copy below takes the same path as its.
      rt.check(rt.api.configure_mem_pool(), "cudaMemPoolSetAttribute");
      rt.check(rt.api.stream_create(&s[d]), "cudaStreamCreateWithFlags");
      rt.check(rt.api.malloc_async(&buf[d], max_copy_bytes, s[d]), "cudaMallocAsync");
      rt.check(rt.api.memset_async(buf[d], 0, max_copy_bytes, s[d]), "cudaMemsetAsync");
      rt.check(rt.api.stream_synchronize(s[d]), "cudaStreamSynchronize");
    }
  }
  ~raw_copies() {
    for (int d = 0; d < devices; ++d) {
      rt.check(rt.api.set_device(d), "cudaSetDevice");
      rt.check(rt.api.free_async(buf[d], s[d]), "cudaFreeAsync");
      rt.check(rt.api.stream_synchronize(s[d]), "cudaStreamSynchronize");
      rt.check(rt.api.stream_destroy(s[d]), "cudaStreamDestroy");
    }
    rt.check(rt.api.free_host(pinned), "cudaFreeHost");
  }

  /// `copies` copies of `bytes` between pinned memory and device 0, one way.
  double host_device_gbps(std::size_t bytes, int copies, bool to_device) {
    auto t0 = clock_type::now();
    rt.check(rt.api.set_device(0), "cudaSetDevice");
    for (int i = 0; i < copies; ++i) {
      if (to_device)
        rt.check(rt.api.memcpy_async(buf[0], pinned, bytes, s[0]), "cudaMemcpyAsync");
      else
        rt.check(rt.api.memcpy_async(pinned, buf[0], bytes, s[0]), "cudaMemcpyAsync");
    }
    rt.check(rt.api.stream_synchronize(s[0]), "cudaStreamSynchronize");
    return gbps(bytes, copies, seconds_since(t0));
  }

  /// On device 1's stream, as the driver copies (on the destination's).
  double device_to_device_gbps(int copies) {
    auto t0 = clock_type::now();
    rt.check(rt.api.set_device(1), "cudaSetDevice");
    for (int i = 0; i < copies; ++i)
      rt.check(rt.api.memcpy_peer_async(buf[1], 1, buf[0], 0, max_copy_bytes, s[1]),
               "cudaMemcpyPeerAsync");
    rt.check(rt.api.stream_synchronize(s[1]), "cudaStreamSynchronize");
    return gbps(max_copy_bytes, copies, seconds_since(t0));
  }
};

/// `n` floats, different for each `tag`.
std::vector<float> pattern(std::size_t n, int tag) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(tag) * 131) % 100003) + 0.25f;
  return v;
}

/// What is wrong with `got` (empty when it equals `want`): the first
/// element that differs, and how many do.
std::string data_wrong(const std::vector<float>& got, const std::vector<float>& want,
                     const std::string& what) {
  std::size_t bad = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0)
      first = i;
  if (bad == 0)
    return {};
  return what + ": " + std::to_string(bad) + " of " + std::to_string(want.size()) +
         " floats differ, the first at " + std::to_string(first) + " (" +
         std::to_string(got[first]) + ", expected " + std::to_string(want[first]) + ")";
}

/// The floats of `t` in `c`, through to_host.
std::vector<float> read_node(backend& b, const context& c, const tnode& t) {
  std::vector<float> out(t.size_in_bytes / sizeof(float), -12345.0f);
  if (!b.to_host(c, t, std::as_writable_bytes(std::span{out})))
    die("to_host: the context does not hold node " + t.label);
  b.sync(b.all_work(c.device));
  return out;
}

/// from_host and to_host of one size, each against cudaMemcpyAsync, then
/// the data checked.
void host_copies(backend& b, raw_copies& base, std::size_t bytes, int id, int repeats,
                 verdicts& v) {
  auto d0 = b.get_device(0);
  auto label = size_label(bytes);
  tnode t{id, "copy_" + label, bytes};
  std::size_t n = bytes / sizeof(float);
  int copies = copies_for(bytes);
  // Ordinary (pageable) host memory, as a caller has it; the driver stages
  // it through its own pinned buffers.
  auto src = pattern(n, 1);
  std::vector<float> dst(n);
  auto c = b.alloc_node(b.make_context(d0), t);
  b.sync(b.all_work(d0));

  auto [ours, theirs] = medians(
    repeats,
    [&] {
      auto t0 = clock_type::now();
      for (int i = 0; i < copies; ++i)
        if (!b.from_host(c, t, std::as_bytes(std::span{src})))
          die("from_host: the context does not hold the node");
      b.sync(b.all_work(d0));
      return gbps(bytes, copies, seconds_since(t0));
    },
    [&] { return base.host_device_gbps(bytes, copies, true); });
  // What from_host writes reads back (a pattern not copied before).
  auto want = pattern(n, 2);
  if (!b.from_host(c, t, std::as_bytes(std::span{want})))
    die("from_host: the context does not hold the node");
  v.measured({"copy_host_to_device_" + label, ours, "cudaMemcpyAsync from pinned memory",
              theirs, "GB/s", "higher"},
             data_wrong(read_node(b, c, t), want, "read back after from_host"));

  std::tie(ours, theirs) = medians(
    repeats,
    [&] {
      auto t0 = clock_type::now();
      for (int i = 0; i < copies; ++i)
        if (!b.to_host(c, t, std::as_writable_bytes(std::span{dst})))
          die("to_host: the context does not hold the node");
      b.sync(b.all_work(d0));
      return gbps(bytes, copies, seconds_since(t0));
    },
    [&] { return base.host_device_gbps(bytes, copies, false); });
  // What to_host brings is what the device holds: a fill written there.
  b.run(b.link(c, "fill", {t, 2.5}));
  v.measured({"copy_device_to_host_" + label, ours, "cudaMemcpyAsync to pinned memory", theirs,
              "GB/s", "higher"},
             data_wrong(read_node(b, c, t), std::vector<float>(n, 2.5f), "to_host after a fill"));
  b.sync_device(d0);
}

void device_copy(backend& b, raw_copies& base, int repeats, verdicts& v) {
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  tnode t{3, "peer", max_copy_bytes};
  int copies = copies_for(max_copy_bytes);
  auto c0 = b.alloc_node(b.make_context(d0), t);
  auto c1 = b.alloc_node(b.make_context(d1), t);
  b.run(b.link(c0, "iota", {t, 0.5}));
  b.sync(b.all_work(d0));
  b.sync(b.all_work(d1));
  auto [ours, theirs] = medians(
    repeats,
    [&] {
      auto t0 = clock_type::now();
      for (int i = 0; i < copies; ++i)
        if (!b.device_to_device(t, merge_buffer_use::no, c1, c0))
          die("device_to_device: a context does not hold the node");
      b.sync(b.all_work(d1));
      return gbps(max_copy_bytes, copies, seconds_since(t0));
    },
    [&] { return base.device_to_device_gbps(copies); });
  v.measured({"copy_device_to_device_" + size_label(max_copy_bytes), ours, "cudaMemcpyPeerAsync",
              theirs, "GB/s", "higher"},
             data_wrong(read_node(b, c1, t), read_node(b, c0, t), "device 1 after the copy"));
  b.sync_device(d0);
  b.sync_device(d1);
}

int usage(const char* why) {
  std::cerr << "bench_cuda: " << why
            << "\nusage: bench_cuda [--json FILE] [--repeats N] [--fake]\n";
  return 2;
}

} // namespace

int main(int argc, char* argv[]) {
  std::optional<std::string> json_path;
  int repeats = 5;
  bool fake = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << "usage: bench_cuda [--json FILE] [--repeats N] [--fake]\n";
      return 0;
    } else if (a == "--fake") {
      fake = true;
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--repeats" && i + 1 < argc) {
      char* end = nullptr;
      long r = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || r < 1 || r > 1000)
        return usage("--repeats must be a whole number from 1 to 1000");
      repeats = static_cast<int>(r);
    } else {
      return usage(("unexpected argument '" + a + "'").c_str());
    }
  }

  verdicts v;
  try {
    backend b{fake ? backend_options{.driver = "fake_cuda", .num_devices = 2}
                   : backend_options{.driver = "cuda"}};
    // The runtime the driver uses (the fake's own instance with --fake).
    cuda::api* api = detail::api_of(*b.impl().drv);
    int n = b.num_devices();
    if (n == 0 || !api || (!fake && !cuda::built_with_cuda())) {
      auto why = cuda::built_with_cuda() ? unavailable_reason(b)
                                         : std::string{"a build without the CUDA Toolkit"};
      std::cout << "bench_cuda: skipped: " << why << "\n";
      for (const auto& name : figure_names())
        v.skipped(name, why);
      if (json_path)
        write_json(*json_path, v.figures);
      return 77;
    }
    raw rt{*api};
    std::cout << "bench_cuda: " << n << (fake ? " fake" : "") << " CUDA device(s), " << repeats
              << " repetitions each, medians\n";
    auto too_few = "needs 2 GPUs, this machine has " + std::to_string(n);
    kernel_chain(b, rt, repeats, v);
    if (n >= 2)
      event_hop(b, rt, repeats, v);
    else
      v.skipped("event_hop", too_few);
    raw_copies base{rt, n};
    int id = 20;
    for (auto bytes : copy_sizes)
      host_copies(b, base, bytes, id++, repeats, v);
    if (n >= 2)
      device_copy(b, base, repeats, v);
    else
      v.skipped("copy_device_to_device_" + size_label(max_copy_bytes), too_few);
  } catch (const std::exception& e) {
    die(std::string{"error: "} + e.what());
  }
  if (json_path)
    write_json(*json_path, v.figures);
  std::cout << "bench_cuda: done\n";
  return v.failed > 0 ? 1 : 0;
}
