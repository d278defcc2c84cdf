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
  /// Only these cases (exact names, e.g. `fan_dag_4dev`); all when empty.
  std::vector<std::string> only;
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
  /// Not measured, and why (e.g. "skipped: oneTBB not installed"); then
  /// the values are 0 and no bound counts.
  std::string skipped;
  /// Whether both bounds that are set are met (true for a skipped entry:
  /// nothing was measured to miss them; its JSON says null).
  bool meets_target() const;
};

/// The names of every case `run_benchmarks` measures, in order (for
/// `--only` and `--help`).
const std::vector<std::string>& case_names();

std::vector<bench_result> run_benchmarks(const backend_options& opts, const bench_options& b);

/// `v` with its unit as a person reads it: thousands separated by commas
/// and no decimals from 1,000 up (`6,141,203 tasks/s`), one decimal from 1
/// (`313.4 ns/task`), three significant digits below (`0.0028`).
std::string format_quantity(double v, const std::string& unit);

/// The table printed to stdout.
std::string format_table(const std::vector<bench_result>& rs);

/// The JSON array written by `--json FILE`.
std::string to_json(const std::vector<bench_result>& rs);

/// Writes the scaling results of `rs` (`scale_*`) as SVG charts into `dir`
/// (created if missing); returns the files written. Throws
/// `std::runtime_error` naming the file it could not write.
std::vector<std::string> write_plots(const std::vector<bench_result>& rs, const std::string& dir);

} // namespace multidev::tools
