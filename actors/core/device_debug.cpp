// A device core's debug info, as an s-expression.
#include "actors/core/device_inspector.hpp"

#include "actors/core/device_core.hpp"
#include "actors/core/trace.hpp"

#include <fmt/format.h>

namespace multidev::detail {

namespace {
/// Records of the trace that debug info shows.
constexpr std::size_t debug_info_records = 8;
} // namespace

sexp device_inspector::debug_info() const {
  auto s = core_.queue().scheduled();
  auto f = core_.outcomes().finished();
  auto pending_waits = gates_.pending_waits();
  std::size_t waiting;
  std::string parked;
  {
    std::lock_guard guard{core_.outcomes().waiters_mutex()};
    waiting = events_.count_locked();
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
  auto pools = core_.pools().info();
  auto spare = extras_.spare_count();
  auto err = core_.life().error();
  auto info = sexp::list({sexp::atom("device"), sexp::field("name", core_.name()),
                          sexp::field("queue_length", std::to_string(s - f)),
                          sexp::field("scheduled", std::to_string(s)),
                          sexp::field("finished", std::to_string(f)),
                          sexp::field("pending_waits", std::to_string(pending_waits)),
                          sexp::field("waiters", std::to_string(waiting)),
                          sexp::field("parked_on", parked.empty() ? "none" : parked),
                          sexp::field("error", err ? *err : std::string{"none"}),
                          sexp::field("used_memory", std::to_string(core_.pools().used_memory())),
                          sexp::field("spare_extras", std::to_string(spare)),
                          sexp::field("run_by", core_.runner().handover().token().state_name()),
                          sexp::field("run_by_others",
                                      std::to_string(core_.runner().handover().token().run_by_others())),
                          sexp::field("cpu", core_.runner().runner_cpu() < 0
                                                 ? std::string{"any"}
                                                 : std::to_string(core_.runner().runner_cpu())),
                          pools});
  if (auto extra = core_.drv().debug_info(core_.ordinal()); !extra.items().empty())
    info.push_back(std::move(extra));
  if (trace_)
    info.push_back(trace_->info(debug_info_records));
  return info;
}

} // namespace multidev::detail
