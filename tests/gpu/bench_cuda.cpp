// bench_cuda: the CUDA driver's figures, each beside its raw-CUDA baseline
// measured in the same run (white-box: the baselines call the runtime through
// `cuda::real_api()`, the very layer the driver uses).
//
//   event_hop                     a ping-pong between devices 0 and 1 through
//                                 will_wait_for, one 1-float `fill` per hop,
//                                 vs the same kernels on two raw streams
//                                 chained by cudaEventRecord +
//                                 cudaStreamWaitEvent (us per hop; lower is
//                                 better; as many hops per sample as take
//                                 ~0.2 s at multidev's pace, 100 to 5000).
//                                 Needs 2 GPUs.
//   copy_host_to_device_64MiB     from_host of a 64 MiB node vs
//                                 cudaMemcpyAsync from pinned memory (GB/s;
//                                 higher is better).
//   copy_device_to_device_64MiB   device_to_device (merge_buffer_use::no) of a
//                                 64 MiB node from device 0 to 1 vs
//                                 cudaMemcpyPeerAsync (GB/s; higher is
//                                 better). Needs 2 GPUs.
//
// Like `multidev bench` (tools/bench.cpp): one unrecorded warm-up round, then
// multidev and its baseline alternate, `--repeats` rounds (default 5), and
// the medians are reported; ratio = multidev / baseline. Without a GPU (or in
// a build without the CUDA Toolkit) it prints `bench_cuda: skipped: <why>`
// and exits 0. `--json FILE` writes the figures as a JSON array of
// {name, multidev, baseline, unit, ratio, better}. Every status the raw
// runtime returns is checked: a failure prints the call and the error's name
// and exits 1.
#include "devices/cuda/cuda_api.hpp"
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

/// Hops per event_hop sample: as many as take about `hop_sample_s` at
/// multidev's pace (measured once, first), within these bounds, so that a
/// slow hop cannot make the run long.
constexpr int min_hops = 100;
constexpr int max_hops = 5000;
constexpr double hop_sample_s = 0.2;
/// Bytes of each copied node.
constexpr std::size_t copy_bytes = std::size_t{64} << 20;
/// Copies per bandwidth sample: a few back to back, then one synchronize.
constexpr int copies_per_sample = 4;

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

void print(const figure& f) {
  std::printf("%s: multidev %.2f %s, %s %.2f %s, ratio %.2f (%s is better)\n", f.name.c_str(),
              f.multidev, f.unit.c_str(), f.baseline_label.c_str(), f.baseline, f.unit.c_str(),
              f.ratio(), f.better.c_str());
  std::fflush(stdout);
}

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

figure event_hop(backend& b, raw rt, int repeats) {
  device d[2] = {b.get_device(0), b.get_device(1)};
  tnode t[2] = {tnode{1, "hop0", sizeof(float)}, tnode{2, "hop1", sizeof(float)}};
  context c[2] = {b.alloc_node(b.make_context(d[0]), t[0]),
                  b.alloc_node(b.make_context(d[1]), t[1])};
  routine r[2] = {b.link(c[0], "fill", {t[0], 1.0}), b.link(c[1], "fill", {t[1], 2.0})};
  b.sync(b.all_work(d[0]));
  b.sync(b.all_work(d[1]));
  raw_hops base{rt};
  // Calibration (also warms up both): how many hops a sample takes.
  multidev_hop_us(b, c, r, min_hops);
  double us = multidev_hop_us(b, c, r, min_hops);
  int hops = static_cast<int>(std::clamp(hop_sample_s * 1e6 / std::max(us, 1e-3),
                                         double{min_hops}, double{max_hops}));
  base.us_per_hop(min_hops);
  auto [ours, theirs] = medians(
    repeats, [&] { return multidev_hop_us(b, c, r, hops); },
    [&] { return base.us_per_hop(hops); });
  std::printf("bench_cuda: %d hops per event_hop sample\n", hops);
  b.sync_device(d[0]);
  b.sync_device(d[1]);
  return {"event_hop", ours, "cudaStreamWaitEvent loop", theirs, "us", "lower"};
}

// -- copies -----------------------------------------------------------------------------

double gbps(double secs) {
  return static_cast<double>(copy_bytes) * copies_per_sample / secs / 1e9;
}

/// The raw side of both copies: pinned host memory, a buffer on device 0 and
/// (with 2 devices) one on device 1, a stream on each device.
struct raw_copies {
  raw rt;
  int devices;
  void* pinned = nullptr;
  void* buf[2]{};
  cuda::stream_t s[2]{};

  raw_copies(raw r, int n) : rt(r), devices(std::min(n, 2)) {
    rt.check(rt.api.malloc_host(&pinned, copy_bytes), "cudaMallocHost");
    std::memset(pinned, 0x5a, copy_bytes); // touches every page
    for (int d = 0; d < devices; ++d) {
      rt.check(rt.api.set_device(d), "cudaSetDevice");
      // As the driver does (idempotent): keep freed memory and let peers
      // reach the pool, so the peer copy below takes the same path as its.
      rt.check(rt.api.configure_mem_pool(), "cudaMemPoolSetAttribute");
      rt.check(rt.api.stream_create(&s[d]), "cudaStreamCreateWithFlags");
      rt.check(rt.api.malloc_async(&buf[d], copy_bytes, s[d]), "cudaMallocAsync");
      rt.check(rt.api.memset_async(buf[d], 0, copy_bytes, s[d]), "cudaMemsetAsync");
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

  double host_to_device_gbps() {
    auto t0 = clock_type::now();
    rt.check(rt.api.set_device(0), "cudaSetDevice");
    for (int i = 0; i < copies_per_sample; ++i)
      rt.check(rt.api.memcpy_async(buf[0], pinned, copy_bytes, s[0]), "cudaMemcpyAsync");
    rt.check(rt.api.stream_synchronize(s[0]), "cudaStreamSynchronize");
    return gbps(seconds_since(t0));
  }

  /// On device 1's stream, as the driver copies (on the destination's).
  double device_to_device_gbps() {
    auto t0 = clock_type::now();
    rt.check(rt.api.set_device(1), "cudaSetDevice");
    for (int i = 0; i < copies_per_sample; ++i)
      rt.check(rt.api.memcpy_peer_async(buf[1], 1, buf[0], 0, copy_bytes, s[1]),
               "cudaMemcpyPeerAsync");
    rt.check(rt.api.stream_synchronize(s[1]), "cudaStreamSynchronize");
    return gbps(seconds_since(t0));
  }
};

void copies(backend& b, raw rt, int repeats, std::vector<figure>& out) {
  int n = b.num_devices();
  auto d0 = b.get_device(0);
  tnode t{3, "copy", copy_bytes};
  // Ordinary (pageable) host memory, as a caller of from_host has it; the
  // driver stages it through its own pinned buffers.
  std::vector<std::byte> host(copy_bytes, std::byte{0x5a});
  auto c0 = b.alloc_node(b.make_context(d0), t);
  b.sync(b.all_work(d0));
  raw_copies base{rt, n};

  auto [ours, theirs] = medians(
    repeats,
    [&] {
      auto t0 = clock_type::now();
      for (int i = 0; i < copies_per_sample; ++i)
        if (!b.from_host(c0, t, host))
          die("from_host: the context does not hold the node");
      b.sync(b.all_work(d0));
      return gbps(seconds_since(t0));
    },
    [&] { return base.host_to_device_gbps(); });
  out.push_back({"copy_host_to_device_64MiB", ours, "cudaMemcpyAsync from pinned memory",
                 theirs, "GB/s", "higher"});
  print(out.back());

  if (n < 2) {
    std::printf("copy_device_to_device_64MiB: skipped: needs 2 GPUs, this machine has %d\n", n);
    std::fflush(stdout);
    b.sync_device(d0);
    return;
  }
  auto d1 = b.get_device(1);
  auto c1 = b.alloc_node(b.make_context(d1), t);
  b.sync(b.all_work(d1));
  std::tie(ours, theirs) = medians(
    repeats,
    [&] {
      auto t0 = clock_type::now();
      for (int i = 0; i < copies_per_sample; ++i)
        if (!b.device_to_device(t, merge_buffer_use::no, c1, c0))
          die("device_to_device: a context does not hold the node");
      b.sync(b.all_work(d1));
      return gbps(seconds_since(t0));
    },
    [&] { return base.device_to_device_gbps(); });
  out.push_back({"copy_device_to_device_64MiB", ours, "cudaMemcpyPeerAsync", theirs, "GB/s",
                 "higher"});
  print(out.back());
  b.sync_device(d0);
  b.sync_device(d1);
}

int usage(const char* why) {
  std::cerr << "bench_cuda: " << why << "\nusage: bench_cuda [--json FILE] [--repeats N]\n";
  return 2;
}

} // namespace

int main(int argc, char* argv[]) {
  std::optional<std::string> json_path;
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << "usage: bench_cuda [--json FILE] [--repeats N]\n";
      return 0;
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

  std::vector<figure> figures;
  try {
    backend b{backend_options{.driver = "cuda"}};
    auto api = cuda::real_api();
    int n = b.num_devices();
    if (n == 0 || !api) {
      std::cout << "bench_cuda: skipped: " << unavailable_reason(b) << "\n";
      if (json_path)
        write_json(*json_path, figures);
      return 0;
    }
    raw rt{*api};
    std::cout << "bench_cuda: " << n << " CUDA device(s), " << repeats
              << " repetitions each, medians\n";
    if (n >= 2) {
      figures.push_back(event_hop(b, rt, repeats));
      print(figures.back());
    } else {
      std::printf("event_hop: skipped: needs 2 GPUs, this machine has %d\n", n);
      std::fflush(stdout);
    }
    copies(b, rt, repeats, figures);
  } catch (const std::exception& e) {
    die(std::string{"error: "} + e.what());
  }
  if (json_path)
    write_json(*json_path, figures);
  std::cout << "bench_cuda: done\n";
  return 0;
}
