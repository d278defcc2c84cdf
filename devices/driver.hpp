#pragma once
/// \file
/// The seam between the scheduler and a kind of hardware. A driver allocates
/// device memory, moves bytes and describes its devices; it never spawns
/// actors or threads and never sends messages (the runner and the actor in
/// `actors/` own concurrency). Tests substitute fakes.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "multidev/sexp.hpp"
#include "multidev/types.hpp"

namespace multidev::detail {

/// One block of device memory; freed by its destructor.
class allocation {
public:
  virtual ~allocation() = default;
  /// The first byte; valid (non-null) even for a zero-size allocation.
  virtual std::byte* base() const noexcept = 0;
};

/// A kind of device: memory, copies, and what it reports about itself.
class driver {
public:
  virtual ~driver() = default;
  /// The backend name, e.g. `"multidev_cpu"`.
  virtual const std::string& backend_name() const = 0;
  /// Devices this driver exposes. May enumerate hardware: call lazily.
  virtual int device_count() const = 0;
  /// Description of every device (for `static_properties`).
  virtual sexp properties() const = 0;
  /// The minimum across devices; all empty when not applicable.
  virtual hardware_limits limits() const = 0;
  /// Allocates `size` bytes aligned to `alignment` (a power of two) on device
  /// `ordinal`. Throws `std::bad_alloc` when out of memory.
  virtual std::unique_ptr<allocation> allocate(int ordinal, std::size_t size,
                                               std::size_t alignment,
                                               std::optional<memory_mode> mode) = 0;
  /// Zeroes `n` bytes of device memory (runs on the device's runner).
  virtual void zero(std::byte* p, std::size_t n) = 0;
  /// Copies `n` bytes between memories this driver can address (runs on the
  /// destination device's runner).
  virtual void copy(std::byte* dst, const std::byte* src, std::size_t n) = 0;
};

/// The CPU driver: host memory, `num_devices` devices (default: hardware threads).
std::shared_ptr<driver> make_cpu_driver(std::optional<int> num_devices);

} // namespace multidev::detail
