#pragma once
/// \file
/// Drivers by name: `backend_options::driver` picks one. `cpu` runs tasks on
/// the device's runner thread; `fake` stands in for an asynchronous device
/// (tests), completing work on its own threads; `cuda` drives the GPUs
/// through the CUDA runtime (none without a GPU); `fake_cuda` is the same
/// driver over a fake runtime (tests).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "devices/driver.hpp"

namespace multidev::detail {

/// What a driver is made with (the driver-related `backend_options`).
struct driver_params {
  /// Devices it exposes; default: the driver's own choice.
  std::optional<int> num_devices;
};

/// Makes a driver. Touches no hardware: drivers enumerate lazily.
using driver_factory = std::function<std::shared_ptr<driver>(const driver_params&)>;

/// The factory registered as `name`. Throws `std::invalid_argument` naming
/// `name` and the registered drivers when there is none.
const driver_factory& find_driver(std::string_view name);

/// The registered driver names, sorted.
std::vector<std::string> driver_names();

} // namespace multidev::detail
