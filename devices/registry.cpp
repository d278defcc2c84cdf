#include "devices/registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <stdexcept>

#include "devices/fake/fake_driver.hpp"

namespace multidev::detail {

namespace {

const std::map<std::string, driver_factory, std::less<>>& registry() {
  static const std::map<std::string, driver_factory, std::less<>> drivers{
    {"cpu", [](const driver_params& p) { return make_cpu_driver(p.num_devices); }},
    {"fake", [](const driver_params& p) { return make_fake_driver(p.num_devices); }},
  };
  return drivers;
}

} // namespace

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
