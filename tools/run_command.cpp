#include "run_command.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <fstream>
#include <iostream>
#include <mutex>

#include "scenario/scenario.hpp"

namespace multidev::tools {

namespace {

/// Writes `text` to `path`; false (with a line on stderr) when it cannot.
bool write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out{path, std::ios::binary};
  out << text;
  out.close();
  if (!out) {
    std::cerr << fmt::format("multidev run: cannot write the {} to {}\n", what, path);
    return false;
  }
  return true;
}

} // namespace

int run_scenario(caf::actor_system& sys, const run_command_options& opts) {
  using namespace multidev::scenario;
  std::shared_ptr<const program> prog;
  try {
    prog = load_file(opts.file, opts.seed);
  } catch (const script_error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  run_options ro;
  ro.system = &sys;
  ro.nodes = opts.nodes;
  ro.spawn_nodes = opts.spawn_nodes;
  ro.node_args = opts.node_args;
  // --spawn-nodes starts this very binary as `multidev node`.
  char self[4096];
  auto n = readlink("/proc/self/exe", self, sizeof self - 1);
  ro.tool = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string{"multidev"};
  ro.step_timeout_s = opts.step_timeout_s;
  // Live progress only on a terminal: piped output stays clean.
  bool live = !opts.quiet && isatty(STDOUT_FILENO) == 1;
  bool shown = false;
  std::mutex out_mu;
  if (live)
    ro.on_progress = [&](const std::vector<device_progress>& ps) {
      std::string line = "\r\033[K";
      uint64_t done = 0, scheduled = 0;
      for (std::size_t d = 0; d < ps.size(); ++d) {
        done += ps[d].done;
        scheduled += ps[d].scheduled;
        if (d < 8)
          line += fmt::format("d{} {}/{}  ", d, ps[d].done, ps[d].scheduled);
      }
      line += fmt::format("{}total {}/{} items done", ps.size() > 8 ? "...  " : "", done,
                          scheduled);
      std::lock_guard guard{out_mu};
      std::cout << line << std::flush;
      shown = true;
    };
  run_result r;
  try {
    r = run(*prog, ro);
  } catch (const script_error& e) {
    std::lock_guard guard{out_mu};
    if (shown)
      std::cout << "\r\033[K" << std::flush;
    std::cerr << e.what() << "\n";
    return 2;
  }
  if (shown)
    std::cout << "\r\033[K" << std::flush;
  auto text = summary(r);
  if (opts.quiet) {
    // The failures and the verdict only.
    auto first_newline = text.find('\n');
    text = text.substr(first_newline + 1);
  }
  std::cout << text << std::flush;
  bool written = true;
  if (!opts.report.empty())
    written &= write_file(opts.report, report(r).to_string() + "\n", "report");
  if (!opts.trace.empty())
    written &= write_file(opts.trace, chrome_trace_json(r), "trace");
  if (!opts.logical_trace.empty())
    written &= write_file(opts.logical_trace, logical_trace(r), "logical trace");
  if (!opts.timeline.empty())
    written &= write_file(opts.timeline, timeline_svg(r), "timeline");
  return r.ok() && written ? 0 : 1;
}

} // namespace multidev::tools
