#include "actors/core/result_board.hpp"

namespace multidev::detail {

void result_board::publish(const std::string& name, kernel_result r) {
  std::lock_guard guard{mu_};
  results_[name] = r;
}

std::optional<kernel_result> result_board::get(const std::string& name) const {
  std::lock_guard guard{mu_};
  if (auto i = results_.find(name); i != results_.end())
    return i->second;
  return std::nullopt;
}

} // namespace multidev::detail
