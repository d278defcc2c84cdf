#pragma once
/// \file
/// Turning a `task_spec` into work on one device: the kernel is looked up,
/// its arguments and declared preconditions checked, its buffers (and, for a
/// merge-buffer kernel, pool 0) resolved through the device's pool table now
/// (at schedule time) and held until the task is gone.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "actors/core/device_core.hpp"
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

/// Schedules `specs` in order on `core` (`backend::schedule_batch`): every
/// one is bound first, so a spec that does not fit schedules none; returns
/// their seqs. `may_wait` as for `device_core::push` (actor handlers: false).
std::vector<uint64_t> push_batch(const std::shared_ptr<device_core>& core,
                                 std::span<const task_spec> specs, bool may_wait = false);

} // namespace multidev::detail
