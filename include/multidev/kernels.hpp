#pragma once
/// \file
/// The kernel registry: named kernels are what scenarios and remote nodes
/// schedule. A `task_spec` (name + arguments) is resolved here into the work a
/// runner executes. Built in: `fill`, `iota`, `scale`, `axpy`,
/// `add_from_merge`, `checksum`, `spin_ns`, `fail` (see docs/kernels.md).
/// Buffers hold `float` elements. No CAF.

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "multidev/task.hpp"

namespace multidev {

/// The kind of one kernel parameter.
enum class arg_kind { integer, real, string, buffer };

std::string to_string(arg_kind k);

class kernel_call;

/// A named kernel: its parameters, which buffer parameters it reads and
/// writes, whether it reads the merge buffer, and the work.
struct kernel_def {
  std::vector<arg_kind> params;
  /// Indices into `params` of buffers the kernel reads.
  std::vector<int> reads;
  /// Indices into `params` of buffers the kernel writes.
  std::vector<int> writes;
  /// Index of the buffer parameter naming the node expected in the merge
  /// buffer (its size bounds what is read); -1 when the kernel does not use it.
  int merge_buffer_param = -1;
  /// Runs on the device's runner thread; throwing fails the device.
  std::function<void(kernel_call&)> body;
  /// One line for `--help` and docs.
  std::string doc;
};

/// What a kernel body sees: its arguments, with buffers resolved to memory.
class kernel_call {
public:
  virtual ~kernel_call() = default;
  virtual int64_t integer(int i) const = 0;
  virtual double real(int i) const = 0;
  virtual const std::string& string(int i) const = 0;
  /// The bytes of buffer parameter `i`.
  virtual std::span<std::byte> buffer(int i) const = 0;
  /// The device's merge buffer as the runner sees it now (pool 0).
  virtual std::span<std::byte> merge_buffer() const = 0;
  /// Publishes a host-visible result under `name` (see `backend::result`).
  virtual void publish(const std::string& name, double sum, uint64_t hash,
                       std::size_t count) const = 0;
  /// The executing device's name.
  virtual const std::string& device_name() const = 0;

  /// Buffer parameter `i` as floats (its size must be a multiple of 4).
  std::span<float> floats(int i) const;
};

/// Registers (or replaces) a kernel under `name`. Thread-safe.
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

} // namespace multidev
