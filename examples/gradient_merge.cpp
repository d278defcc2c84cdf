// Data-parallel gradient merge across 4 devices, checked against the host.
#include "gradient_merge.hpp"

#include <cstdio>

int main() {
  constexpr int devices = 4;
  constexpr std::size_t n = 1 << 16;
  multidev::backend b{multidev::backend_options{.num_devices = devices}};
  auto p = gradient_merge::setup(b, devices, n);
  std::vector<float> merged;
  gradient_merge::step(b, p, merged);
  auto expected = gradient_merge::host_sum(devices, n);
  std::size_t wrong = 0;
  for (std::size_t j = 0; j < n; ++j)
    wrong += merged[j] != expected[j];
  auto sum = b.result("grad");
  std::printf("merged %zu floats from %d devices: %zu mismatches, checksum %.6g\n", n,
              devices, wrong, sum ? sum->sum : 0.0);
  return wrong == 0 ? 0 : 1;
}
