#pragma once
/// \file
/// Teardowns that must not run on the thread that asks for them. A backend
/// whose last reference goes inside one of its own tasks (on its runner) or
/// in a handler on its own actor system (on a CAF worker) cannot tear
/// itself down there: joining the runners and waiting for the actors would
/// wait for that very thread. `~backend` then hands the teardown to the
/// reaper and returns; the teardown finishes once the thread has moved on.
///
/// One per process. Each teardown runs on a thread of its own (one
/// teardown may wait for a runner that is busy dropping another backend),
/// joined by the next `adopt` once finished, and all of them when the
/// process exits (the reaper's destructor), so no teardown outlives the
/// program and none is cut short.

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace multidev::detail {

class reaper {
public:
  /// The process's reaper.
  static reaper& instance();

  /// Runs `job` (moved from) on a new thread and returns at once. False
  /// when no thread could be started: `job` is left as it was, not run.
  bool adopt(std::function<void()>& job) noexcept;
  /// Teardowns adopted and not yet finished; for tests.
  std::size_t pending() const;

  /// Joins every teardown.
  ~reaper();
  reaper(const reaper&) = delete;
  reaper& operator=(const reaper&) = delete;

private:
  reaper() = default;

  struct job_thread {
    std::thread thread;
    std::shared_ptr<bool> done; // guarded by mu_
  };
  mutable std::mutex mu_;
  std::vector<job_thread> threads_;
};

} // namespace multidev::detail
