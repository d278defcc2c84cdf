// What one locked instruction costs here, back to back and uncontended: a
// `lock add` on a line this thread owns, against a plain add (median of 5
// runs of 10^8 each). scripts/count-hop-costs.sh prints it beside the
// counts, to turn them into time.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>

int main() {
  constexpr long n = 100'000'000;
  alignas(64) static std::atomic<long> counters[8];
  auto median_ns = [&](auto&& step) {
    std::array<double, 5> runs{};
    for (auto& r : runs) {
      auto t0 = std::chrono::steady_clock::now();
      for (long i = 0; i < n; ++i)
        step(i);
      r = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
    }
    std::sort(runs.begin(), runs.end());
    return runs[2];
  };
  double locked = median_ns([](long i) { counters[i & 7].fetch_add(1, std::memory_order_relaxed); });
  volatile long sink = 0;
  double plain = median_ns([&](long) { sink = sink + 1; });
  std::printf("a locked add: %.2f ns back to back (a plain add to memory: %.2f ns)\n", locked, plain);
  return 0;
}
