#pragma once
/// \file
/// The kernel registry: named kernels are what scenarios and remote nodes
/// schedule. A `task_spec` (name + arguments) is resolved here into the work a
/// runner executes. Built in: `fill`, `iota`, `scale`, `axpy`,
/// `add_from_merge`, `checksum`, `spin_ns`, `fail` (see docs/kernels.md).
/// Buffers hold `float` elements unless a kernel declares otherwise. No CAF.
///
/// A kernel declares, with its signature, every precondition it can check
/// from its arguments (`kernel_def::element_size`, `merge_buffer_param`,
/// `check`). `link`, `schedule_named` and the device actor's `schedule`
/// message run those checks before anything is queued and refuse a bad call
/// with `std::invalid_argument`, leaving the device as it was; a body only
/// throws (and fails its device) for what cannot be known in advance.

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "multidev/task.hpp"

namespace multidev {

/// Host-visible results written by kernels (e.g. `checksum`), by name.
struct kernel_result {
  /// The sum of the elements.
  double sum = 0;
  /// The FNV-1a hash of the bytes.
  uint64_t hash = 0;
  /// The number of elements.
  std::size_t count = 0;
  /// Member-wise equality.
  friend bool operator==(const kernel_result&, const kernel_result&) = default;
};

/// The kind of one kernel parameter.
enum class arg_kind { integer, real, string, buffer };

/// The name as printed in errors: `"int"`, `"float"`, `"string"`, `"buffer"`.
std::string to_string(arg_kind k);

class kernel_call;
class kernel_args;

/// A named kernel: its parameters, which buffer parameters it reads and
/// writes, whether it reads the merge buffer, the preconditions it checks
/// before it is scheduled, and the work.
///
/// The preconditions run on the thread that links or schedules, in this
/// order, and the first that fails refuses the call with
/// `std::invalid_argument` naming the kernel, the argument(s) and what was
/// expected (docs/kernels.md lists the built-ins' checks):
///  1. every argument has its parameter's kind (`params`);
///  2. every buffer argument holds a whole number of `element_size` bytes;
///  3. with a `merge_buffer_param`: the device has a merge buffer (pool 0)
///     and it holds at least that parameter's size;
///  4. `check`, when set.
struct kernel_def {
  /// The kind of each parameter, in order.
  std::vector<arg_kind> params;
  /// Indices into `params` of buffers the kernel reads.
  std::vector<int> reads;
  /// Indices into `params` of buffers the kernel writes.
  std::vector<int> writes;
  /// Index of the buffer parameter naming the node expected in the merge
  /// buffer (its size bounds what is read); -1 when the kernel does not use
  /// it. A kernel that uses it reads pool 0 as it was when the task was linked
  /// or scheduled, and is refused where the device has no merge buffer or one
  /// smaller than that parameter.
  int merge_buffer_param = -1;
  /// Runs as a task of the device (`task`); throwing fails the device.
  std::function<void(kernel_call&)> body;
  /// One line for `--help` and docs.
  std::string doc;
  /// Bytes per element of every buffer parameter: a buffer argument whose
  /// size is not a multiple is refused. `sizeof(float)` by default (what
  /// `kernel_call::floats` needs); 1 accepts any size. Must be positive.
  std::size_t element_size = sizeof(float);
  /// Optional: the kernel's own preconditions on its arguments (sizes that
  /// must agree, scalars in range, the merge buffer's size). Runs after the
  /// declarative checks above, on the linking or scheduling thread, and must
  /// only read its argument; it refuses the call by throwing
  /// `std::invalid_argument` saying which argument(s) and what was expected
  /// (multidev prefixes `kernel 'NAME': ` unless the message starts with
  /// `kernel 'NAME'`). Anything else it throws refuses the call the same way.
  std::function<void(const kernel_args&)> check;
};

/// A read-only view of a kernel's arguments before anything is scheduled:
/// what `kernel_def::check` sees. The kinds have been checked already, so an
/// accessor of the declared kind never throws; one of another kind, or an
/// index out of range, throws `std::invalid_argument`. Valid only during the
/// call it is passed to (it refers to the caller's `task_spec`).
class kernel_args {
public:
  /// `merge_buffer_size`: the bytes of the device's merge buffer (pool 0)
  /// now, or nullopt when it has none.
  kernel_args(const task_spec& spec, std::optional<std::size_t> merge_buffer_size)
    : spec_(&spec), merge_buffer_size_(merge_buffer_size) {}

  /// The kernel's name.
  const std::string& kernel() const { return spec_->kernel; }
  /// The number of arguments.
  std::size_t size() const { return spec_->args.size(); }
  /// An `int` argument.
  int64_t integer(int i) const;
  /// A `float` argument; an `int` one converted.
  double real(int i) const;
  /// A `string` argument.
  const std::string& string(int i) const;
  /// The size in bytes of buffer argument `i` (for the merge-buffer
  /// parameter: the size of the node expected in the merge buffer).
  std::size_t buffer_size(int i) const;
  /// The bytes of the device's merge buffer (pool 0) when the task is linked
  /// or scheduled; nullopt when the device has none.
  std::optional<std::size_t> merge_buffer_size() const { return merge_buffer_size_; }

private:
  const kernel_arg& arg(int i) const;

  const task_spec* spec_;
  std::optional<std::size_t> merge_buffer_size_;
};

/// What a kernel body sees: its arguments, with buffers resolved to memory.
class kernel_call {
public:
  virtual ~kernel_call() = default;
  /// An `int` argument.
  virtual int64_t integer(int i) const = 0;
  /// A `float` argument; an `int` one converted.
  virtual double real(int i) const = 0;
  /// A `string` argument.
  virtual const std::string& string(int i) const = 0;
  /// The bytes of buffer parameter `i`; for the merge-buffer parameter, the
  /// first bytes of the merge buffer, as many as that parameter's size.
  virtual std::span<std::byte> buffer(int i) const = 0;
  /// The whole merge buffer (pool 0) as it was when the task was linked or
  /// scheduled; later `alloc_pool`/`free_pool` of pool 0 do not change it.
  /// Throws `std::logic_error` for a kernel without a `merge_buffer_param`.
  virtual std::span<std::byte> merge_buffer() const = 0;
  /// Publishes a host-visible result under `name` (see `backend::result`).
  virtual void publish(const std::string& name, double sum, uint64_t hash,
                       std::size_t count) const = 0;
  /// The executing device's name.
  virtual const std::string& device_name() const = 0;

  /// Buffer parameter `i` as floats (its size must be a multiple of 4).
  std::span<float> floats(int i) const;
};

/// Registers (or replaces) a kernel under `name`. Thread-safe. Throws
/// `std::invalid_argument` (and keeps the old kernel) for an empty name, no
/// body, an element size of 0, or `reads`/`writes`/`merge_buffer_param`
/// indices that are not buffer parameters.
void register_kernel(const std::string& name, kernel_def def);

/// The kernel registered under `name`, or nullptr. The pointer stays valid
/// until the kernel is replaced.
std::shared_ptr<const kernel_def> find_kernel(const std::string& name);

/// Names of all registered kernels, sorted.
std::vector<std::string> kernel_names();

/// Throws `std::invalid_argument` unless argument `i` of `kernel` may be
/// `got` where the kernel expects `want` (an int is accepted for a float).
void check_kernel_arg(const std::string& kernel, std::size_t i, arg_kind want,
                      const kernel_arg& got);

/// Checks `spec` against the registered kernel's parameters; throws
/// `std::invalid_argument` naming the kernel, the argument and the kinds.
std::shared_ptr<const kernel_def> check_task_spec(const task_spec& spec);

/// Runs the preconditions `def` declares (steps 2-4 of `kernel_def`) on
/// `args`, whose kinds `check_task_spec` has accepted. Throws
/// `std::invalid_argument` naming the kernel, the argument(s) and what was
/// expected. Called by `link`, `schedule_named` and the `schedule` message
/// before anything is queued.
void check_preconditions(const kernel_def& def, const kernel_args& args);

} // namespace multidev
