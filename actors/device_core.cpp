// A device core's life: start, stop accepting, cancel what may never be
// answered, drain, join.
#include "actors/device_core.hpp"

#include <fmt/format.h>

#include "actors/trace.hpp"

namespace multidev::detail {

device_core::device_core(std::string name, int ordinal, std::shared_ptr<driver> drv,
                         std::size_t queue_capacity,
                         std::shared_ptr<result_board> results, std::size_t trace_capacity)
  : name_(std::move(name)), ordinal_(ordinal), driver_(std::move(drv)),
    capacity_(queue_capacity == 0 ? 1 : queue_capacity),
    results_(std::move(results)),
    trace_(trace_capacity > 0 ? std::make_unique<trace_ring>(trace_capacity) : nullptr),
    used_(std::make_shared<std::atomic<std::size_t>>(0)) {
  thread_ = std::thread([this] { run(); });
}

device_core::~device_core() {
  shutdown();
}

void device_core::request_stop() {
  {
    std::lock_guard guard{mu_};
    if (stopping_)
      return;
    stopping_ = true;
    room_.notify_all();
  }
  // Remote answers may never come once we stop: cancel those waits.
  static const std::string why = "the wait was cancelled at shutdown";
  cancel_remote_waits(why);
  call_room_callback();
  ring();
}

bool device_core::stopping() const {
  std::lock_guard guard{mu_};
  return stopping_;
}

void device_core::shutdown() {
  request_stop();
  cancel_unanswerable_waits();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id())
    thread_.join();
  // Anything still awaited can never complete now: the message first, then
  // the fail bit that makes waiters read it.
  if (finished() < scheduled()) {
    {
      std::lock_guard guard{mu_};
      if (!failed_) {
        failed_ = true;
        error_ = "device is shut down";
      }
    }
    progress_.fetch_or(fail_bit);
  }
  {
    std::lock_guard guard{waiters_mu_};
    closed_ = true; // later waits for seqs not reached fail at once
  }
  fail_waiters("device is shut down");
  std::lock_guard guard{pools_mu_};
  pools_.clear();
}

} // namespace multidev::detail
