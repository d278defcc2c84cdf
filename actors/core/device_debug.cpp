// A device core's debug info, as an s-expression.
#include "actors/core/device_core.hpp"
#include "actors/core/trace.hpp"

#include <fmt/format.h>

namespace multidev::detail {

namespace {
/// Records of the trace that debug info shows.
constexpr std::size_t debug_info_records = 8;
} // namespace

sexp device_core::debug_info() const {
  auto s = queue_.scheduled();
  auto f = outcomes_.finished();
  auto pending_waits = gates_.pending_waits();
  std::size_t waiting;
  std::string parked;
  {
    std::lock_guard guard{outcomes_.waiters_mutex()};
    waiting = outcomes_.waiter_count_locked() + gate_waiters_.size_locked();
    // Named through the list of pending gates, which keeps them alive: the
    // parked one may be passed and freed meanwhile.
    if (auto* p = gates_.parked_on(std::memory_order_acquire))
      gates_.find_locked([&](const std::shared_ptr<gate>& g) {
        if (g.get() != p)
          return false;
        parked = g->what();
        return true;
      });
  }
  auto pools = pools_.info();
  auto spare = extras_.spare_count();
  auto err = error();
  auto info = sexp::list({sexp::atom("device"), sexp::field("name", name_),
                          sexp::field("queue_length", std::to_string(s - f)),
                          sexp::field("scheduled", std::to_string(s)),
                          sexp::field("finished", std::to_string(f)),
                          sexp::field("pending_waits", std::to_string(pending_waits)),
                          sexp::field("waiters", std::to_string(waiting)),
                          sexp::field("parked_on", parked.empty() ? "none" : parked),
                          sexp::field("error", err ? *err : std::string{"none"}),
                          sexp::field("used_memory", std::to_string(pools_.used_memory())),
                          sexp::field("spare_extras", std::to_string(spare)),
                          sexp::field("run_by", token().state_name()),
                          sexp::field("run_by_others", std::to_string(token().run_by_others())),
                          sexp::field("cpu", runner_.runner_cpu() < 0 ? std::string{"any"}
                                                              : std::to_string(runner_.runner_cpu())),
                          pools});
  if (auto extra = driver_->debug_info(ordinal_); !extra.items().empty())
    info.push_back(std::move(extra));
  if (trace_)
    info.push_back(trace_->info(debug_info_records));
  return info;
}

} // namespace multidev::detail
