#pragma once
// `multidev run FILE`: loads a scenario, runs it, prints the summary and
// writes the files asked for.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace caf {
class actor_system;
} // namespace caf

namespace multidev::tools {

struct run_command_options {
  std::string file;
  std::string trace;
  std::string report;
  std::string logical_trace;
  std::string timeline;
  std::optional<uint64_t> seed;
  /// --param NAME=VALUE, read by the script's (param NAME DEFAULT).
  std::map<std::string, std::string> params;
  double step_timeout_s = 60;
  bool quiet = false;
  /// --node NAME=HOST:PORT
  std::map<std::string, std::string> nodes;
  bool spawn_nodes = false;
  /// Passed to the nodes --spawn-nodes starts (the TLS files).
  std::vector<std::string> node_args;
  /// --cookie-file: the nodes' cookie (empty: the default file).
  std::string cookie_file;
};

/// Whether every output file asked for (--trace, --report, --logical-trace,
/// --timeline) can be written, checked before anything runs: what is wrong
/// with the first that cannot (`--trace out/t.json: cannot write there: No
/// such file or directory`), or nothing. Leaves no file behind.
std::optional<std::string> check_outputs(const run_command_options& opts);

/// Returns the exit status: 0 every expectation held and nothing failed
/// that none saw, 1 otherwise (or an output could not be written after
/// all), 2 the script is wrong.
int run_scenario(caf::actor_system& sys, const run_command_options& opts);

} // namespace multidev::tools
