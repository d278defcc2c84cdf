#pragma once
// `multidev bench`: each figure beside a baseline measured in the same run.

#include <optional>
#include <string>
#include <vector>

#include <multidev/backend.hpp>

namespace multidev::tools {

struct bench_options {
  /// Fewer iterations (for CI smoke runs); figures are noisier.
  bool quick = false;
  /// Only benchmarks whose name contains this.
  std::string filter;
  /// Repetitions per figure; the median is reported.
  int repeats = 7;
};

/// One figure: `value` of multidev beside `baseline_value` of `baseline`.
struct bench_result {
  std::string name;
  std::string unit;
  double value = 0;
  std::string baseline;
  double baseline_value = 0;
  /// value / baseline_value.
  double ratio = 0;
  /// "lower" or "higher": which direction of `ratio` is better.
  std::string better = "lower";
  /// The bound the ratio must meet (e.g. 1.0 for <= 1.0 when lower is
  /// better, 0.9 for >= 0.9 when higher is better); none when informative.
  std::optional<double> target;
  /// An absolute bound `value` must meet, in `unit`, in the same direction
  /// (e.g. 2.0 for idle CPU <= 2.0 ms/s); none when only the ratio counts.
  std::optional<double> value_target;
  /// Whether both bounds that are set are met.
  bool meets_target() const;
};

std::vector<bench_result> run_benchmarks(const backend_options& opts, const bench_options& b);

/// The table printed to stdout.
std::string format_table(const std::vector<bench_result>& rs);

/// The JSON array written by `--json FILE`.
std::string to_json(const std::vector<bench_result>& rs);

} // namespace multidev::tools
