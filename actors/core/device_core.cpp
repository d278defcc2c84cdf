// A device core's life: start, stop accepting, cancel what may never be
// answered, drain, join; and its failure state's transitions (device_life).
#include "actors/core/device_core.hpp"

#include <fmt/format.h>

#include "actors/core/backstop.hpp"
#include "actors/core/trace.hpp"

namespace multidev::detail {

namespace {
// Runner threads (of any device) never wait for room in a queue.
bool on_a_runner() noexcept {
  return current_runner != nullptr;
}
// Made at load time: it stands in when memory runs out.
const failure shut_down_cause{failure::kind::failed, {}, {}, 0, "device is shut down", {}};
} // namespace

device_core::device_core(std::string name, int ordinal, std::shared_ptr<driver> drv,
                         std::size_t queue_capacity,
                         std::shared_ptr<result_board> results, std::size_t trace_capacity,
                         std::size_t max_in_flight, bool hand_over, bool pin_runner)
  : name_(std::move(name)), ordinal_(ordinal), driver_(std::move(drv)),
    results_(std::move(results)), queue_(queue_capacity, on_a_runner), outcomes_(name_),
    trace_(trace_capacity > 0 ? std::make_unique<trace_ring>(trace_capacity) : nullptr),
    life_(name_, queue_, outcomes_, gates_), events_(*this, outcomes_), pools_(name_),
    window_(*this, outcomes_, trace_ ? &trace_->clock() : nullptr, this) {
  window_.attach(driver_->open_stream(ordinal_, window_.sink()), max_in_flight);
  // An asynchronous driver's items run on its stream: nothing to hand over.
  runner_.start(hand_over && !window_.async(), pin_runner);
}

device_core::~device_core() {
  shutdown();
  if (runner_.handover().enabled())
    wake_backstop::instance().forget(this);
}

void device_life::request_stop() {
  {
    std::lock_guard guard{queue_.mutex()};
    if (queue_.stopping_locked())
      return;
    queue_.refuse_locked(true, false);
  }
  // Remote answers may never come once we stop: cancel those waits.
  static const std::string why = "the wait was cancelled at shutdown";
  cancel_remote_waits(why);
  queue_.call_room_callback();
  queue_.ring();
}

bool device_life::stopping() const {
  std::lock_guard guard{queue_.mutex()};
  return queue_.stopping_locked();
}

void device_core::shutdown() {
  life_.request_stop();
  life_.cancel_unanswerable_waits();
  // Not from the device's own runner (or stream): it cannot wait for itself.
  if (runner_.joinable() && current_runner != this) {
    window_.closing(); // bounds what stays in flight (a hung GPU)
    runner_.join();
    window_.close(); // the runner resolved everything it submitted
    // Its orders' pools, if it stopped without going idle: the memory goes now.
    extras_.let_go_of_spent_pools();
  }
  {
    std::lock_guard guard{outcomes_.waiters_mutex()};
    outcomes_.close_locked(); // later waits for seqs not reached fail at once
  }
  // Anything still awaited can never complete now (shut down from its own
  // runner, which cannot drain itself).
  if (outcomes_.finished() < queue_.scheduled()) {
    try {
      auto cause = life_.device_failure("device is shut down");
      events_.fire(UINT64_MAX, cause.get());
    } catch (...) {
      events_.fire(UINT64_MAX, &shut_down_cause);
    }
  } else {
    events_.fire(outcomes_.finished());
  }
  pools_.clear();
}

uint64_t device_life::cancel(std::string why) {
  auto cause = std::make_shared<failure>();
  cause->origin_kind = failure::kind::cancelled;
  cause->device = name_;
  cause->message = why.empty() ? std::string{"cancelled"} : std::move(why);
  uint64_t upto = 0;
  {
    std::lock_guard guard{queue_.mutex()};
    if (queue_.scheduled(std::memory_order_relaxed) > outcomes_.dropped_upto(std::memory_order_relaxed)) {
      drop_locked(cause);
      upto = outcomes_.dropped_upto(std::memory_order_relaxed);
    }
  }
  // A runner parked on a wait sleeps on the bell: wake it to drop the wait.
  queue_.ring_bell();
  return upto;
}

void device_life::kill(std::string reason) {
  auto cause = device_failure("killed: " + reason);
  {
    std::lock_guard guard{queue_.mutex()};
    // Killed already, or shut down with nothing left: nothing to fail.
    if (killed_ ||
        (queue_.stopping_locked() && outcomes_.finished() == queue_.scheduled(std::memory_order_relaxed)))
      return;
    killed_ = true;
    queue_.refuse_locked(true, true); // wakes the producers waiting for room
    failed_flag_.store(true, std::memory_order_release);
    error_ = cause;
    drop_locked(cause);
  }
  static const std::string why = "the device was killed";
  cancel_remote_waits(why);
  queue_.call_room_callback();
  queue_.ring_bell();
}

bool device_life::recover() {
  std::lock_guard guard{queue_.mutex()};
  if (!queue_.failed_locked() || killed_ || queue_.stopping_locked())
    return false;
  queue_.accept_again_locked();
  failed_flag_.store(false, std::memory_order_release);
  error_.reset();
  return true;
}

void device_life::cancel_past_lease() noexcept {
  if (queue_.scheduled(std::memory_order_acquire) > outcomes_.dropped_upto(std::memory_order_acquire)) {
    try {
      cancel(lease_.why());
    } catch (...) {
      cancel();
    }
  }
}

} // namespace multidev::detail
