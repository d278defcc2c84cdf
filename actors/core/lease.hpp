#pragma once
/// \file
/// A session's lease on a device (actors/remote/node.cpp): the device's
/// runner starts an item only while the lease's deadline is in the future.
/// Every ordinary backend's device has no lease and pays one branch on a
/// null pointer per item (`over`, inline on the runner's path).
///
/// Invariants:
/// - Without `set` (or after `set` with a null deadline), `over()` is false
///   and reads nothing but the pointer.
/// - The deadline word (steady-clock nanoseconds) is shared with the node's
///   session, which renews it; once `over()` found it in the past it stores
///   0 there: the lease is over for good (the node refuses a renewal of 0),
///   and every later `over()` is true.
///
/// Threads: `set` before the device's runner starts items (before any work
/// is scheduled); `over` and `why`: the thread that starts the device's
/// items (its runner). The deadline word itself is atomic: the node renews
/// it from its own thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace multidev::detail {

class session_lease {
public:
  /// Makes the device a session's: items start only while `*deadline` is in
  /// the future. `why`: what the items cancelled past it say.
  void set(std::shared_ptr<std::atomic<int64_t>> deadline, std::string why) {
    why_ = std::move(why);
    deadline_ = deadline.get();
    holder_ = std::move(deadline);
  }
  /// Before an item starts: whether the lease is over (the caller then
  /// cancels what is not started). False at once without a lease.
  bool over() noexcept {
    if (deadline_) [[unlikely]]
      return over_slow();
    return false;
  }
  /// What the items cancelled past the lease say.
  const std::string& why() const noexcept { return why_; }

private:
  [[gnu::noinline, gnu::cold]] bool over_slow() noexcept {
    auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
                 .count();
    if (deadline_->load(std::memory_order_acquire) > now)
      return false;
    // Over for good: a renewal that comes later finds 0 and is refused.
    deadline_->store(0, std::memory_order_release);
    return true;
  }

  // Read by the runner before each item; null for a device without a lease.
  std::atomic<int64_t>* deadline_ = nullptr;
  // What `deadline_` points to, and why items dropped past it are cancelled.
  std::shared_ptr<std::atomic<int64_t>> holder_;
  std::string why_;
};

} // namespace multidev::detail
