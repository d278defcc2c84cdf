#pragma once
/// \file
/// Work for a device: `task` (a closure, local only) and `task_spec` (a named
/// kernel with serializable arguments, resolved through the kernel registry on
/// the device's side; the only kind of work that can cross a process). No CAF.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "multidev/sexp.hpp"
#include "multidev/trace.hpp"
#include "multidev/types.hpp"

namespace multidev {

/// A unit of work for one device's runner (OCANNL's `Task.t`): a description
/// plus the work, and optionally a value kept alive while the task lives.
/// The work runs on the device's runner thread (or, with
/// `backend_options::hand_over`, on that of a device waiting for it), one
/// task at a time, in the device's order; if it throws, the device fails.
/// `keep_alive` (and the work's captures, when the task has a description or
/// a `keep_alive`) are released before the task's event is done; a bare
/// closure's captures go by the end of the runner's current batch.
/// `kind` only labels the task in the runner trace (`multidev/trace.hpp`).
struct task {
  /// What the task is, for errors, debug info and traces; may be empty.
  std::string description;
  /// The work.
  std::function<void()> work;
  /// Kept alive while the task lives; may be null.
  std::shared_ptr<const void> keep_alive;
  /// The task's label in the runner trace.
  trace_kind kind = trace_kind::task;
};

/// `(task (description ..) (keeps_alive true|false))`.
sexp to_sexp(const task& t);

/// A buffer argument of a named kernel: `size_in_bytes` bytes at `loc` in the
/// executing device's pool table.
struct buffer_arg {
  /// Where the bytes start.
  buffer_loc loc;
  /// How many bytes.
  std::size_t size_in_bytes = 0;
  /// Member-wise equality.
  friend bool operator==(const buffer_arg&, const buffer_arg&) = default;
};

/// One argument of a named kernel. `std::monostate` is never valid; it only
/// keeps the type default-constructible for serialization.
using kernel_arg =
  std::variant<std::monostate, int64_t, double, std::string, buffer_arg>;

/// The argument's kind, as printed in errors: `"int"`, `"float"`,
/// `"string"`, `"buffer"`.
std::string kind_name(const kernel_arg& a);

/// A scalar as an atom, a buffer as `(buffer (pool ..) (offset ..) (size ..))`.
sexp to_sexp(const kernel_arg& a);

/// A named kernel call: what scenarios and remote nodes schedule.
struct task_spec {
  /// The kernel's registered name.
  std::string kernel;
  /// Its arguments, one per parameter.
  std::vector<kernel_arg> args;
  /// Member-wise equality.
  friend bool operator==(const task_spec&, const task_spec&) = default;
};

/// `(<kernel> <arg>...)`.
sexp to_sexp(const task_spec& t);

} // namespace multidev
