#include "run_command.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>

#include "scenario/scenario.hpp"

namespace multidev::tools {

namespace {

/// Writes what `write` puts out to `path`; false (with a line on stderr)
/// when it cannot.
template <class F>
bool write_file(const std::string& path, F write, const char* what) {
  std::ofstream out{path, std::ios::binary};
  if (out)
    write(out);
  out.close();
  if (!out) {
    std::cerr << fmt::format("multidev run: cannot write the {} to {}\n", what, path);
    return false;
  }
  return true;
}

/// Writes `text` to `path`; false (with a line on stderr) when it cannot.
bool write_file(const std::string& path, const std::string& text, const char* what) {
  return write_file(path, [&](std::ostream& out) { out << text; }, what);
}

/// Whether `path` can be written, without changing it: a file that was not
/// there is made and removed again.
std::optional<std::string> cannot_write(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return std::nullopt;
  }
  if (errno == EEXIST) {
    fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC); // no O_TRUNC: left as it is
    if (fd >= 0) {
      ::close(fd);
      return std::nullopt;
    }
  }
  return std::string{std::strerror(errno)};
}

/// The terminal's width in columns: TIOCGWINSZ on stdout, else $COLUMNS,
/// else 80.
std::size_t terminal_width() {
  winsize ws{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    char* end = nullptr;
    long n = std::strtol(c, &end, 10);
    if (end != c && *end == '\0' && n > 0 && n < 100'000)
      return static_cast<std::size_t>(n);
  }
  return 80;
}

} // namespace

std::optional<std::string> check_outputs(const run_command_options& opts) {
  std::pair<const char*, const std::string*> outputs[] = {{"--report", &opts.report},
                                                          {"--trace", &opts.trace},
                                                          {"--logical-trace", &opts.logical_trace},
                                                          {"--timeline", &opts.timeline}};
  for (auto [option, path] : outputs)
    if (!path->empty())
      if (auto why = cannot_write(*path))
        return fmt::format("{} {}: cannot write there: {}", option, *path, *why);
  return std::nullopt;
}

int run_scenario(caf::actor_system& sys, const run_command_options& opts) {
  using namespace multidev::scenario;
  std::shared_ptr<const program> prog;
  try {
    prog = load_file(opts.file, opts.seed, opts.params);
  } catch (const script_error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  run_options ro;
  ro.system = &sys;
  ro.nodes = opts.nodes;
  ro.spawn_nodes = opts.spawn_nodes;
  ro.node_args = opts.node_args;
  ro.cookie_file = opts.cookie_file;
  // --spawn-nodes starts this very binary as `multidev node`.
  char self[4096];
  auto n = readlink("/proc/self/exe", self, sizeof self - 1);
  ro.tool = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string{"multidev"};
  ro.step_timeout_s = opts.step_timeout_s;
  // The outputs are made from the run's record when written: the Chrome
  // trace streams to its file, nothing is drawn in memory during the run.
  ro.timeline = false;
  // Live progress only on a terminal: piped output stays clean.
  bool live = !opts.quiet && isatty(STDOUT_FILENO) == 1;
  bool shown = false;
  std::mutex out_mu;
  auto start = std::chrono::steady_clock::now();
  if (live)
    ro.on_progress = [&](const std::vector<device_progress>& ps) {
      // One line narrower than the terminal (asked each time: it may have
      // been resized), so that "\r" and erasing the line redraw it whole.
      std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
      auto line = "\r\033[K" + progress_line(ps, elapsed.count(), terminal_width());
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
    written &= write_file(
      opts.trace, [&](std::ostream& out) { write_chrome_trace(r, out); }, "trace");
  if (!opts.logical_trace.empty())
    written &= write_file(opts.logical_trace, logical_trace(r), "logical trace");
  if (!opts.timeline.empty())
    written &= write_file(opts.timeline, timeline_svg(r), "timeline");
  return r.ok() && written ? 0 : 1;
}

} // namespace multidev::tools
