#pragma once
/// \file
/// `context` (a device plus the buffers of its nodes) and `routine` (a
/// kernel linked against a context), with what `link` and
/// `device_to_device` take.

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "multidev/device.hpp"
#include "multidev/fwd.hpp"
#include "multidev/sexp.hpp"
#include "multidev/task.hpp"
#include "multidev/types.hpp"

namespace multidev {

/// OCANNL's `context`: a device plus the buffers of the nodes linked against
/// it. Immutable value; `parent` links to the context it was derived from.
struct context {
  multidev::device device;
  std::shared_ptr<const context> parent;
  ctx_buffers buffers;
  bool finalized = false;
  multidev::optimize_ctx optimize;
  std::optional<tnode> merge_buffer_node;
};

sexp to_sexp(const context& c);

/// A kernel linked against a context (see `backend::link`): ready to run on
/// the context's device. `schedule` holds the kernel's pools, resolved when
/// linking; `backend::run` checks they are still the device's pools, orders the
/// work after the writers of `inputs` and records it as the writer of `outputs`.
struct routine {
  multidev::context context;
  multidev::task schedule;
  std::string name;
  std::set<tnode> inputs;
  std::set<tnode> outputs;
  std::optional<tnode> merge_buffer_input;
  /// For a copy made by `device_to_device`: the context copied from.
  std::shared_ptr<const multidev::context> copy_source;
  /// A pool `schedule` holds, which `backend::run` checks is still current.
  struct pinned_pool {
    std::shared_ptr<detail::device_core> core;
    int pool_id = 0;
    std::shared_ptr<const void> pool;
  };
  /// The pools `schedule` holds.
  std::vector<pinned_pool> pinned_pools;
};

sexp to_sexp(const routine& r);

/// Whether `device_to_device` writes into the destination node (`no`) or into
/// the destination's merge buffer (`copy`).
enum class merge_buffer_use { no, copy };

/// A value `link` binds to a kernel parameter: a number, a string, or a node
/// whose buffer the context holds.
using link_arg = std::variant<int64_t, double, std::string, tnode>;

} // namespace multidev
