#include "devices/registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <stdexcept>

#include "devices/cuda/cuda_driver.hpp"
#include "devices/cuda/fake_cuda_api.hpp"
#include "devices/fake/fake_driver.hpp"

namespace multidev::detail {

namespace {

const std::map<std::string, driver_factory, std::less<>>& registry() {
  static const std::map<std::string, driver_factory, std::less<>> drivers{
    {"cpu", [](const driver_params& p) { return make_cpu_driver(p.num_devices); }},
    {"fake", [](const driver_params& p) { return make_fake_driver(p.num_devices); }},
    {"cuda",
     [](const driver_params& p) { return make_cuda_driver(cuda::real_api(), p.num_devices); }},
    // The CUDA driver over a fake runtime (host threads for streams): its
    // logic, without a GPU. As many fake GPUs as asked (default 2).
    {"fake_cuda",
     [](const driver_params& p) {
       return make_cuda_driver(std::make_shared<cuda::fake_api>(p.num_devices.value_or(2)),
                               std::nullopt, "multidev_fake_cuda");
     }},
  };
  return drivers;
}

} // namespace

void driver::run_kernel(const std::string& name, const kernel_call&) {
  throw std::logic_error(fmt::format("driver {} runs no kernel on the device (asked for '{}')",
                                     backend_name(), name));
}

const driver_factory& find_driver(std::string_view name) {
  auto& r = registry();
  auto i = r.find(name);
  if (i == r.end())
    throw std::invalid_argument(fmt::format("unknown driver '{}' (this build has: {})", name,
                                            fmt::join(driver_names(), ", ")));
  return i->second;
}

std::vector<std::string> driver_names() {
  std::vector<std::string> names;
  for (const auto& [name, f] : registry())
    names.push_back(name);
  return names;
}

} // namespace multidev::detail
