// The reaper: teardowns handed over by a thread that cannot wait for them.
#include "actors/reaper.hpp"

#include <algorithm>
#include <cstdio>

namespace multidev::detail {

reaper& reaper::instance() {
  static reaper r;
  return r;
}

bool reaper::adopt(std::function<void()>& job) noexcept {
  std::vector<std::thread> finished;
  bool started = false;
  {
    std::lock_guard guard{mu_};
    // Threads whose teardown is over: joined below, outside the lock.
    for (auto& t : threads_)
      if (*t.done)
        finished.push_back(std::move(t.thread));
    std::erase_if(threads_, [](const job_thread& t) { return !t.thread.joinable(); });
    std::shared_ptr<std::function<void()>> box;
    try {
      threads_.reserve(threads_.size() + 1); // push_back below cannot throw
      auto done = std::make_shared<bool>(false);
      box = std::make_shared<std::function<void()>>(std::move(job));
      std::thread thread{[this, done, box] {
        try {
          (*box)();
        } catch (...) {
          // A teardown does not throw; should it, the process goes on.
        }
        *box = nullptr; // what it captured goes on this thread too
        std::lock_guard guard{mu_};
        *done = true;
      }};
      threads_.push_back({std::move(thread), std::move(done)});
      started = true;
    } catch (...) {
      // Out of threads or memory: nothing ran, `job` is given back.
      if (box && *box)
        job = std::move(*box);
    }
  }
  for (auto& t : finished)
    t.join();
  return started;
}

std::size_t reaper::pending() const {
  std::lock_guard guard{mu_};
  return static_cast<std::size_t>(
    std::count_if(threads_.begin(), threads_.end(), [](const job_thread& t) { return !*t.done; }));
}

reaper::~reaper() {
  // Until none is left: a teardown may hand over another one.
  for (;;) {
    std::vector<job_thread> all;
    {
      std::lock_guard guard{mu_};
      all.swap(threads_);
    }
    if (all.empty())
      return;
    for (auto& t : all)
      if (t.thread.joinable())
        t.thread.join();
  }
}

} // namespace multidev::detail
