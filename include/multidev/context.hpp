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
  /// The device the context runs on.
  multidev::device device;
  /// The context this one was derived from (`make_child`, `alloc_node`); null for a root.
  std::shared_ptr<const context> parent;
  /// The nodes the context holds and where their buffers are.
  ctx_buffers buffers;
  /// OCANNL's flag, carried along; the scheduler does not read it.
  bool finalized = false;
  /// The optimization settings it was compiled with.
  multidev::optimize_ctx optimize;
  /// The node the device's merge buffer is expected to hold (see `device_to_device`).
  std::optional<tnode> merge_buffer_node;
};

/// `(context (device ..) (parent some|none) (ctx_buffers ..) (finalized ..) ...)`.
sexp to_sexp(const context& c);

/// A kernel linked against a context (see `backend::link`): ready to run on
/// the context's device. `schedule` holds the kernel's pools, resolved when
/// linking; `backend::run` checks they are still the device's pools, orders the
/// work after the writers of `inputs` and records it as the writer of `outputs`.
struct routine {
  /// The context it was linked against.
  multidev::context context;
  /// The work, as a task for the context's device.
  multidev::task schedule;
  /// The kernel's name (or the copy's description).
  std::string name;
  /// The nodes it reads: it runs after their writers.
  std::set<tnode> inputs;
  /// The nodes it writes: it becomes their writer.
  std::set<tnode> outputs;
  /// The node it expects in the merge buffer, when it reads it.
  std::optional<tnode> merge_buffer_input;
  /// For a copy made by `device_to_device`: the context copied from.
  std::shared_ptr<const multidev::context> copy_source;
  /// A pool `schedule` holds, which `backend::run` checks is still current.
  struct pinned_pool {
    /// The device whose pool it is (internal).
    std::shared_ptr<detail::device_core> core;
    /// The pool's id there.
    int pool_id = 0;
    /// The pool, as it was when linking.
    std::shared_ptr<const void> pool;
  };
  /// The pools `schedule` holds.
  std::vector<pinned_pool> pinned_pools;
};

/// `(routine (name ..) (context ..) (inputs <label>...) (outputs <label>...)
/// (merge_buffer_input ..))`.
sexp to_sexp(const routine& r);

/// Whether `device_to_device` writes into the destination node (`no`) or into
/// the destination's merge buffer (`copy`).
enum class merge_buffer_use { no, copy };

/// A value `link` binds to a kernel parameter: a number, a string, or a node
/// whose buffer the context holds.
using link_arg = std::variant<int64_t, double, std::string, tnode>;

} // namespace multidev
