#pragma once
/// \file
/// A workaround for CAF 0.17's logger ties (NOTES.md, pitfall 9).

#include <caf/logger.hpp>

namespace multidev::detail {

/// CAF ties a thread to an actor system's logger (a thread-local reference)
/// whenever an actor (a scoped_actor too) or an actor_system is created on it,
/// and ~actor_system waits until every such reference is gone. Without this, a
/// host thread that once called `alloc_pool` (say) would keep the system from
/// shutting down from any other thread for as long as it lives. Unties the
/// thread again when it had no tie before.
class logger_tie_guard {
public:
  logger_tie_guard() : prev_(caf::logger::current_logger()) {
  }
  ~logger_tie_guard() {
    if (prev_ == nullptr && caf::logger::current_logger() != nullptr)
      caf::logger::set_current_actor_system(nullptr);
  }
  logger_tie_guard(const logger_tie_guard&) = delete;
  logger_tie_guard& operator=(const logger_tie_guard&) = delete;

private:
  caf::logger* prev_;
};

} // namespace multidev::detail
