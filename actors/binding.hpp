#pragma once
/// \file
/// Turning a `task_spec` into work on one device: the kernel is looked up,
/// its arguments and declared preconditions checked, its buffers (and, for a
/// merge-buffer kernel, pool 0) resolved through the device's pool table now
/// (at schedule time) and held until the task is gone.

#include <memory>
#include <vector>

#include "actors/device_core.hpp"
#include "multidev/kernels.hpp"

namespace multidev::detail {

struct bound_task {
  task work;
  /// `(pool id, pool)` for every buffer argument resolved.
  std::vector<std::pair<int, std::shared_ptr<pool>>> pools;
};

/// Throws `std::invalid_argument` naming the kernel, the argument, the pool
/// and the device when the spec does not fit, or the kernel's preconditions
/// (`check_preconditions`) refuse it; nothing is queued then.
bound_task bind_spec(const std::shared_ptr<device_core>& core, const task_spec& spec);

} // namespace multidev::detail
