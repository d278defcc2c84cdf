#pragma once
/// \file
/// Where kernels publish host-visible results (`backend::result`).

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "multidev/kernels.hpp"

namespace multidev::detail {

/// Kernel results published by tasks, by name (one board per backend).
class result_board {
public:
  void publish(const std::string& name, kernel_result r);
  std::optional<kernel_result> get(const std::string& name) const;

private:
  mutable std::mutex mu_;
  std::map<std::string, kernel_result> results_;
};

} // namespace multidev::detail
