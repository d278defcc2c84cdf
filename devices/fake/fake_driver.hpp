#pragma once
/// \file
/// A driver for tests whose devices finish work asynchronously, as a CUDA
/// stream does: the device's runner submits an item and moves on, and the
/// item completes later, on another thread. It checks the runner's
/// asynchronous path (in-order retirement, a bounded number in flight,
/// failures and cancellation with items in flight) without a GPU.
///
/// Memory is host memory, as on the CPU driver. Each device has a stream:
/// one thread that runs the submitted items in FIFO order, each after a
/// pseudo-random delay of up to `max_delay` (half of the items get none),
/// and reports each completion right after it ran. White-box tests steer
/// it through the members below; everything is safe from any thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "devices/driver.hpp"

namespace multidev::detail {

/// What one fake device's stream has done so far.
struct fake_stream_stats {
  uint64_t submitted = 0; ///< Items submitted.
  uint64_t started = 0;   ///< Items the stream took to run (or to fail).
  uint64_t reported = 0;  ///< Completions reported (counted just before the sink hears each).
  uint64_t returned = 0;  ///< Completions whose call to the sink has returned.
  /// The most items submitted and not yet reported at one time.
  uint64_t max_outstanding = 0;
  std::size_t held = 0; ///< Completions held back (`hold_completions`).
};

/// The `fake` driver (see the file comment).
class fake_driver final : public driver {
public:
  /// `num_devices` devices (default: hardware threads, as on the CPU). The
  /// delay bound comes from `MULTIDEV_FAKE_DELAY_US` (default 50 µs).
  explicit fake_driver(std::optional<int> num_devices);
  ~fake_driver() override;

  const std::string& backend_name() const override { return name_; }
  int device_count() const override;
  sexp properties() const override;
  hardware_limits limits() const override { return {}; }
  std::unique_ptr<allocation> allocate(int ordinal, std::size_t size, std::size_t alignment,
                                       std::optional<memory_mode> mode) override;
  void zero(std::byte* p, std::size_t n) override;
  void copy(std::byte* dst, const std::byte* src, std::size_t n) override;
  std::unique_ptr<stream> open_stream(int ordinal, completion_sink& sink) override;

  /// Every item of every device waits up to `d` before it runs (0: none).
  void set_max_delay(std::chrono::microseconds d);
  /// The item submitted as `seq` on device `ordinal` does not run: it
  /// completes with a `std::runtime_error(message)`, as a device fault
  /// reported by the stream would.
  void fail_at(int ordinal, uint64_t seq, std::string message);
  /// Device `ordinal`'s stream starts no item until `resume` (submitted
  /// items wait); a closing stream runs them anyway.
  void pause(int ordinal);
  void resume(int ordinal);
  /// While on, items still run in order but their completions are held
  /// until `deliver`; turning it off reports the held ones in seq order.
  void hold_completions(int ordinal, bool on);
  /// Reports the held completion of `seq` (from the stream's thread);
  /// false when none is held for it.
  bool deliver(int ordinal, uint64_t seq);
  fake_stream_stats stats(int ordinal) const;
  /// Waits until `pred` holds for `ordinal`'s stats, at most `limit`;
  /// returns whether it held.
  bool wait_until(int ordinal, const std::function<bool(const fake_stream_stats&)>& pred,
                  std::chrono::milliseconds limit = std::chrono::seconds{30}) const;

  struct lane; // one device's stream state (fake_driver.cpp)

private:
  lane& lane_of(int ordinal) const;

  std::string name_ = "multidev_fake";
  std::shared_ptr<driver> host_; // memory and copies: the CPU driver's
  std::optional<int> requested_;
  std::atomic<int64_t> max_delay_us_;
  mutable std::mutex mu_;
  mutable std::map<int, std::unique_ptr<lane>> lanes_; // guarded by mu_
  mutable std::once_flag props_once_;
  mutable sexp props_;
};

/// A `fake_driver` (the registry's `fake`).
std::shared_ptr<driver> make_fake_driver(std::optional<int> num_devices);

} // namespace multidev::detail
