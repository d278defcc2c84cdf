#pragma once
/// \file
/// The seam between the scheduler and a kind of hardware. A driver allocates
/// device memory, moves bytes, describes its devices and, if it is
/// asynchronous, runs work on its devices' streams and says when it
/// finished. It never spawns actors and never sends messages (the runner and
/// the actor in `actors/` own the schedule); the only threads a driver may
/// own are those that stand in for hardware, like the CUDA runtime's
/// callback thread or the fake driver's streams. Tests substitute fakes.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "multidev/sexp.hpp"
#include "multidev/types.hpp"

namespace multidev {
class kernel_call;
} // namespace multidev

namespace multidev::detail {

/// One block of device memory; freed by its destructor.
class allocation {
public:
  virtual ~allocation() = default;
  /// The first byte; valid (non-null) even for a zero-size allocation.
  virtual std::byte* base() const noexcept = 0;
};

/// Told when work submitted to a `stream` has finished (the device's side of
/// a CUDA event or host callback).
class completion_sink {
public:
  /// The work submitted as `seq` has finished: `error` is null when it
  /// completed, otherwise what it threw or why the device failed it. Called
  /// exactly once per submission, on a driver thread, in any order across
  /// seqs; must not block.
  virtual void completed(uint64_t seq, std::exception_ptr error) noexcept = 0;

protected:
  ~completion_sink() = default;
};

/// One device's in-order work stream on an asynchronous driver (a CUDA
/// stream): work runs in the order submitted, and completes after
/// `submit` returned.
class stream {
public:
  /// Waits until every submitted item has completed and its `completed` call
  /// has returned: the sink hears nothing afterwards.
  virtual ~stream() = default;
  /// Runs `work` on the device after everything submitted before it, and
  /// returns without waiting for it; the sink is told `completed(seq, ...)`
  /// once it finished. `work` runs on a driver thread (or, for real
  /// hardware, launches the device's work from the caller's thread). What it
  /// throws is the error reported. Called by one thread at a time.
  virtual void submit(uint64_t seq, std::function<void()> work) = 0;
  /// The device is shutting down and submits nothing more: a driver whose
  /// work can hang (a GPU kernel that never ends) fails what stays in
  /// flight after a bound of its own, so that the shutdown ends.
  virtual void closing() {}
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
  /// The work stream of device `ordinal`, telling `sink` (which outlives it)
  /// about completions; one per device at a time. Null for a synchronous
  /// driver (the default, and the CPU's): its work runs on the device's
  /// runner thread and is finished when it returns.
  virtual std::unique_ptr<stream> open_stream(int ordinal, completion_sink& sink) {
    (void)ordinal;
    (void)sink;
    return nullptr;
  }
  /// Orders what device `ordinal`'s stream runs next behind item `seq` of
  /// device `other`'s stream (both this driver's), on the hardware itself
  /// (`cudaStreamWaitEvent`), so the runner need not wait on the host.
  /// Returns false when it cannot (no streams, or `seq` is not an item
  /// submitted there): the runner then waits for the event on the host.
  /// When `seq` may be submitted there later, `wake` is called (once, from
  /// any thread) after `other`'s next submission, so the runner can ask
  /// again. Called by `ordinal`'s runner only, between two submissions.
  virtual bool order_after(int ordinal, int other, uint64_t seq,
                           const std::function<void()>& wake) {
    (void)ordinal;
    (void)other;
    (void)seq;
    (void)wake;
    return false;
  }
  /// Whether kernel bodies (`kernel_def::body`) can run on the host against
  /// this driver's memory. True for the CPU and the fake; false for a GPU,
  /// whose named kernels go through `run_kernel`.
  virtual bool host_kernels() const { return true; }
  /// For a driver without host kernels: whether `run_kernel` implements the
  /// named kernel (others are refused before anything is queued).
  virtual bool has_kernel(std::string_view name) const {
    (void)name;
    return false;
  }
  /// Launches the named kernel on the device (inside a stream item's work,
  /// like `zero` and `copy`). Throws what a kernel body would.
  virtual void run_kernel(const std::string& name, const kernel_call& call);
  /// Driver-specific lines for device `ordinal`'s debug info (free and total
  /// memory, a quarantine); an empty list when there is nothing to add.
  virtual sexp debug_info(int ordinal) const {
    (void)ordinal;
    return sexp::list();
  }
};

/// The CPU driver: host memory, `num_devices` devices (default: hardware threads).
std::shared_ptr<driver> make_cpu_driver(std::optional<int> num_devices);

} // namespace multidev::detail
