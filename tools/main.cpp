// multidev: the command-line tool. `multidev --help` lists the commands.
#include <CLI/CLI.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/config_option_set.hpp>
#include <caf/io/middleman.hpp>

#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "bench.hpp"
#include "bind_check.hpp"
#include "node_command.hpp"
#include "run_command.hpp"
#include "terminal.hpp"

namespace {

/// The exit status of every usage error (README: "exit status 2").
constexpr int usage_error = 2;

/// The most CPU devices `-n` asks for (each device that runs work has a thread).
constexpr int64_t max_devices = 4096;

/// Prints one line about a usage error to stderr; returns `usage_error`.
int usage(const std::string& what) {
  std::cerr << "multidev: " << what << " (see multidev --help)\n";
  return usage_error;
}

/// A CAF config that can tell whether CAF knows a command-line option.
class tool_config final : public caf::actor_system_config {
public:
  /// Whether `--name` or `--name=value` is one of CAF's options.
  bool knows(const std::string& arg) const {
    auto name = std::string_view{arg}.substr(2);
    name = name.substr(0, name.find('='));
    return custom_options_.cli_long_name_lookup(caf::string_view{name.data(), name.size()})
           != nullptr;
  }

  /// CAF's options as the command line spells them (`--scheduler.max-threads`).
  std::vector<std::string> option_names() const {
    std::vector<std::string> names;
    for (const auto& opt : custom_options_) {
      auto category = opt.category();
      auto name = opt.long_name();
      std::string cli = "--";
      if (category != "global")
        cli.append(category.data(), category.size()).append(".");
      names.push_back(cli.append(name.data(), name.size()));
    }
    return names;
  }
};

/// The commands, in the order --help lists them.
const std::vector<std::string> command_names{"devices", "kernels", "run", "node", "bench"};

/// "; did you mean X?" when one of `known` is close to `given`, else "".
std::string did_you_mean(const std::string& given, const std::vector<std::string>& known) {
  auto close = multidev::tools::closest_name(given, known);
  return close ? "; did you mean " + *close + "?" : "";
}

/// CAF's own options (`--scheduler.max-threads=2`, also spelled
/// `--caf.scheduler.max-threads=2`; `--config-file=F`) go to CAF's config.
/// What is left after multidev's options must be one of those: returns what
/// is wrong with them in one line, or nothing. An unknown option or command
/// gets the closest of `options` (multidev's that apply), CAF's options and
/// the commands suggested.
std::optional<std::string> configure_caf(tool_config& cfg, std::vector<std::string> extras,
                                         bool have_command, std::vector<std::string> options) {
  // The middleman, heartbeats (a peer silent for 5 s is dropped, its
  // devices fail), the work-sharing scheduler: what a backend's own system
  // has. The command line and a config file override each.
  multidev::configure_system(cfg);
  cfg.set("scheduler.max-threads",
          static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency())));
  auto caf_options = cfg.option_names();
  options.insert(options.end(), caf_options.begin(), caf_options.end());
  for (auto& a : extras) {
    if (a.rfind("--caf.", 0) == 0)
      a = "--" + a.substr(6);
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      if (a.rfind('-', 0) == 0)
        return "unknown option '" + a + "'" + (a.size() > 2 ? did_you_mean(a, options) : "");
      if (!have_command) {
        auto close = multidev::tools::closest_name(a, command_names);
        return "unknown command '" + a + "'" + (close ? " (did you mean " + *close + "?)" : "")
               + "; the commands are devices, kernels, run, node, bench";
      }
      return "unexpected argument '" + a + "'";
    }
    if (!cfg.knows(a))
      return "unknown option '" + a + "', neither multidev's nor CAF's"
             + did_you_mean(a.substr(0, a.find('=')), options);
  }
  std::string given;
  for (const auto& a : extras)
    given += (given.empty() ? "" : " ") + a;
  if (auto err = cfg.parse(std::move(extras)))
    return "CAF rejected '" + given + "': " + caf::to_string(err);
  if (!cfg.remainder.empty())
    return "unexpected argument '" + cfg.remainder.front() + "'";
  return std::nullopt;
}

/// Reads a count given as `text` for `option`; refuses anything but a whole
/// number in `[min, max]` in one line that names the option and repeats what
/// was given.
std::optional<std::string> read_count(const char* option, const std::string& text,
                                      int64_t min, int64_t max, int64_t& out) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool whole = ec != std::errc::invalid_argument && end == text.data() + text.size();
  if (!whole)
    return std::string{option} + " must be a whole number, got '" + text + "'";
  bool negative = !text.empty() && text[0] == '-';
  if (ec == std::errc::result_out_of_range ? negative : v < min)
    return std::string{option} + " must be at least " + std::to_string(min) + ", got " + text;
  if (ec == std::errc::result_out_of_range || v > max)
    return std::string{option} + " must be at most " + std::to_string(max) + ", got " + text;
  out = v;
  return std::nullopt;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"multidev: a task runtime for many devices (OCANNL's Multidev interface "
               "on CAF actors).\nOptions go before or after the command. CAF options pass "
               "through, e.g.\n--scheduler.max-threads=2 or --caf.scheduler.max-threads=2. "
               "Usage errors exit with status 2."};
  app.require_subcommand(0, 1);
  app.allow_extras();
  app.set_version_flag("--version", "multidev " MULTIDEV_VERSION,
                       "print the version (multidev MAJOR.MINOR.PATCH) and exit");
  // Counts are read as text and checked by read_count, so a bad value gets
  // one plain line instead of CLI11's range of the type.
  std::string num_devices;
  auto* num_devices_opt = app.add_option("-n,--num-devices", num_devices,
                                         "number of devices, 1 to 4096 (default: the "
                                         "hardware threads; with --backend cuda, the "
                                         "GPUs found, at most N)")
                            ->type_name("N");
  std::string queue_capacity;
  auto* queue_capacity_opt = app.add_option(
    "--queue-capacity", queue_capacity,
    "tasks a device queues before schedule_task waits for room (at least 1)")->type_name("N");

  // Each command hands the options it does not know to the top level
  // (fallthrough), so `-n 3` works after the command too.
  auto* devices = app.add_subcommand("devices", "print the devices' static properties as an s-expression");
  devices->fallthrough();
  bool limits = false;
  devices->add_flag("--limits", limits, "also print hardware_limits");
  std::string backend_kind = "cpu";
  devices->add_option("--backend", backend_kind,
                      "the driver: cpu (default) or cuda (the GPUs; with none, says why "
                      "and exits 0)")
    ->type_name("KIND")
    ->check(CLI::IsMember({"cpu", "cuda"}));

  auto* kernels = app.add_subcommand("kernels", "list the named kernels");
  kernels->fallthrough();

  auto* run = app.add_subcommand(
    "run", "run a scenario script (docs/scenarios.md) on local devices and the nodes it names; "
           "exit status 0: every expectation held, 1: one did not or something failed that none "
           "saw, 2: the script is wrong (or an output file cannot be written)");
  run->fallthrough();
  multidev::tools::run_command_options ropts;
  run->add_option("FILE", ropts.file, "the scenario script (.scn)")->required();
  run->add_option("--trace", ropts.trace, "write a Chrome trace-event JSON file (Perfetto, "
                                          "chrome://tracing), streamed from the run's record "
                                          "an event at a time")->type_name("FILE");
  run->add_option("--report", ropts.report, "write the full result as an s-expression")
    ->type_name("FILE");
  run->add_option("--logical-trace", ropts.logical_trace,
                  "write the schedule with logical clocks only (same script and seed, same "
                  "file)")->type_name("FILE");
  run->add_option("--timeline", ropts.timeline, "draw the run as an SVG Gantt chart")
    ->type_name("FILE");
  std::string seed;
  auto* seed_opt = run->add_option("--seed", seed, "the seed of random forms (overrides the "
                                                   "script's (seed N))")->type_name("N");
  std::string step_timeout;
  auto* step_timeout_opt =
    run->add_option("--step-timeout", step_timeout,
                    "seconds a blocking step (sync, await, kill) may take before the run stops "
                    "as failed (default 60; fractions allowed)")->type_name("S");
  run->add_flag("--quiet", ropts.quiet, "print only failures and the verdict");
  std::vector<std::string> param_specs;
  run->add_option("--param", param_specs,
                  "a whole number for the script's (param NAME DEFAULT), used as $NAME (repeat "
                  "for each)")->type_name("NAME=VALUE");
  std::vector<std::string> node_addresses;
  run->add_option("--node", node_addresses,
                  "where a node of the script's (nodes ...) runs: NAME=HOST:PORT of a "
                  "multidev node (repeat for each)")->type_name("NAME=HOST:PORT");
  run->add_flag("--spawn-nodes", ropts.spawn_nodes,
                "start a multidev node process for each node given no --node, and stop it at "
                "the end");

  auto* node = app.add_subcommand(
    "node", "serve this process's CPU devices to other processes over CAF's middleman; prints "
            "'listening on ADDR:PORT' when ready; SIGINT or SIGTERM stops it");
  node->fallthrough();
  multidev::tools::node_command_options nopts;
  node->add_option("--bind", nopts.bind, "the address or name to listen on (default 127.0.0.1; "
                                         "unless every address it resolves to is loopback, "
                                         "it needs --allow-remote)")
    ->type_name("ADDR");
  std::string node_port;
  auto* node_port_opt =
    node->add_option("--port", node_port, "the port (default 0: pick one and print it)")
      ->type_name("P");
  std::string cpu_devices;
  auto* cpu_devices_opt =
    node->add_option("--cpu-devices", cpu_devices, "CPU devices to serve (default 1)")
      ->type_name("N");
  node->add_option("--name", nopts.name,
                   "the node's name, which its devices' names start with (default node-<pid>)");
  node->add_flag("--stop-with-parent", nopts.stop_with_parent,
                 "stop as on SIGTERM once nobody reads this process's stdout (for a parent "
                 "that started it through a pipe, as run --spawn-nodes does)");
  std::string memory_limit;
  auto* memory_limit_opt = node->add_option(
    "--memory-limit", memory_limit,
    "the bytes each client's session may hold in pools (suffix K, M, G or T: powers of 1024; "
    "default: half the physical memory); an allocation past it is refused, naming the session")
    ->type_name("BYTES");
  std::string handshake_timeout;
  auto* handshake_timeout_opt = node->add_option(
    "--handshake-timeout", handshake_timeout,
    "seconds a connection may stay open before its peer opened a session with the cookie "
    "(default 10); then it is closed")
    ->type_name("S");
  std::string max_unauthenticated;
  auto* max_unauthenticated_opt = node->add_option(
    "--max-unauthenticated", max_unauthenticated,
    "connections without a session held at once (default 64, at most half the descriptor "
    "limit); a new one past it closes the oldest")
    ->type_name("N");
  bool allow_remote = false;
  node->add_flag("--allow-remote", allow_remote,
                 "allow a --bind address that is not loopback (other machines can then drive "
                 "this node's devices)");

  // TLS between nodes: the same three files on `node` and on `run`; and the
  // cookie that opens a session.
  multidev::tls_files tls;
  std::string cookie_file;
  for (auto* sub : {run, node}) {
    sub->add_option("--cookie-file", cookie_file,
                    "the secret a client must present to open a session on a node (default "
                    "$XDG_CONFIG_HOME/multidev/cookie or ~/.config/multidev/cookie, made on "
                    "first use with mode 0600; refused when others can read it)")
      ->type_name("FILE");
    sub->add_option("--tls-cert", tls.certificate,
                    "TLS between nodes: this side's certificate (PEM); with --tls-key and "
                    "--tls-ca")
      ->type_name("FILE");
    sub->add_option("--tls-key", tls.key, "TLS: this side's private key (PEM)")->type_name("FILE");
    sub->add_option("--tls-ca", tls.ca_file,
                    "TLS: the CA certificate that signed the peers' certificates; a peer "
                    "without one is refused")
      ->type_name("FILE");
  }

  auto* bench = app.add_subcommand(
    "bench", "run the benchmark suite; each figure beside a baseline measured in the same run");
  bench->fallthrough();
  multidev::tools::bench_options bopts;
  std::string json_file;
  bench->add_option("--json", json_file,
                    "write the results as a JSON array of {name, unit, value, baseline, "
                    "baseline_value, ratio, better, target, value_target, meets_target} (plus "
                    "skipped: why, when a peer is not installed)");
  bench->add_flag("--quick", bopts.quick, "fewer iterations (noisier)");
  bench->add_option("--filter", bopts.filter, "only benchmarks whose name contains this");
  bench->add_option("--only", bopts.only, "only these cases (exact names; repeatable)")
    ->type_name("NAME...")
    ->check(CLI::IsMember(multidev::tools::case_names()));
  std::string plot_dir;
  bench->add_option("--plot", plot_dir,
                    "write the scaling results as SVG charts into DIR "
                    "(scale_devices.svg, scale_queue_depth.svg)")
    ->type_name("DIR");
  std::string trace_capacity;
  auto* trace_capacity_opt =
    bench->add_option("--trace-capacity", trace_capacity,
                      "trace each runner's last N items (default: off; "
                      "independent_tasks_trace uses 4096 unless given)")
      ->type_name("N");
  std::string repeats;
  auto* repeats_opt = bench->add_option("--repeats", repeats,
                                        "repetitions per figure, at least 1 (median reported)")
                        ->type_name("N");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e); // help on stdout, status 0
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e); // the version on stdout, status 0
  } catch (const CLI::ParseError& e) {
    return usage(e.what());
  }
  multidev::backend_options opts;
  int64_t count = 0;
  if (num_devices_opt->count() > 0) {
    if (auto bad = read_count("--num-devices", num_devices, 1, max_devices, count))
      return usage(*bad);
    opts.num_devices = static_cast<int>(count);
  }
  if (queue_capacity_opt->count() > 0) {
    if (auto bad = read_count("--queue-capacity", queue_capacity, 1, int64_t{1} << 40, count))
      return usage(*bad);
    opts.queue_capacity = static_cast<std::size_t>(count);
  }
  if (trace_capacity_opt->count() > 0) {
    if (auto bad = read_count("--trace-capacity", trace_capacity, 0, int64_t{1} << 32, count))
      return usage(*bad);
    opts.trace_capacity = static_cast<std::size_t>(count);
  }
  if (seed_opt->count() > 0) {
    if (auto bad = read_count("--seed", seed, 0, INT64_MAX, count))
      return usage(*bad);
    ropts.seed = static_cast<uint64_t>(count);
  }
  if (step_timeout_opt->count() > 0) {
    double v = 0;
    auto [end, ec] = std::from_chars(step_timeout.data(), step_timeout.data() + step_timeout.size(), v);
    if (ec != std::errc{} || end != step_timeout.data() + step_timeout.size() || !(v > 0)
        || v > 86'400)
      return usage("--step-timeout must be a number of seconds above 0 and at most 86400, got '"
                   + step_timeout + "'");
    ropts.step_timeout_s = v;
  }
  if (node_port_opt->count() > 0) {
    if (auto bad = read_count("--port", node_port, 0, 65535, count))
      return usage(*bad);
    nopts.port = static_cast<uint16_t>(count);
  }
  if (memory_limit_opt->count() > 0) {
    std::string digits = memory_limit;
    int shift = 0;
    if (!digits.empty()) {
      auto unit = static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
      auto at = std::string_view{"KMGT"}.find(unit);
      if (at != std::string_view::npos) {
        shift = 10 * static_cast<int>(at + 1);
        digits.pop_back();
      }
    }
    if (auto bad = read_count("--memory-limit", digits, 1, (int64_t{1} << 62) >> shift, count))
      return usage(*bad + " (a number of bytes, with K, M, G or T)");
    nopts.memory_limit = static_cast<std::size_t>(count) << shift;
  }
  if (handshake_timeout_opt->count() > 0) {
    double v = 0;
    auto [end, ec] = std::from_chars(handshake_timeout.data(),
                                     handshake_timeout.data() + handshake_timeout.size(), v);
    if (ec != std::errc{} || end != handshake_timeout.data() + handshake_timeout.size()
        || !(v >= 0.001) || v > 86'400)
      return usage("--handshake-timeout must be a number of seconds from 0.001 to 86400, got '"
                   + handshake_timeout + "'");
    nopts.handshake_timeout = std::chrono::milliseconds{static_cast<int64_t>(v * 1000)};
  }
  if (max_unauthenticated_opt->count() > 0) {
    if (auto bad = read_count("--max-unauthenticated", max_unauthenticated, 1, 1 << 20, count))
      return usage(*bad);
    nopts.max_unauthenticated = static_cast<std::size_t>(count);
  }
  if (cpu_devices_opt->count() > 0) {
    if (auto bad = read_count("--cpu-devices", cpu_devices, 1, max_devices, count))
      return usage(*bad);
    nopts.cpu_devices = static_cast<int>(count);
  }
  // Every address the name resolves to, not its text (issue 38 point 5).
  if (*node && !allow_remote)
    if (auto bad = multidev::tools::non_loopback_bind(nopts.bind))
      return usage(*bad);
  if (*node && (num_devices_opt->count() > 0 || queue_capacity_opt->count() > 0))
    return usage("node serves --cpu-devices N devices; -n and --queue-capacity do not apply to it");
  for (const auto& spec : param_specs) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
      return usage("--param takes NAME=VALUE, got '" + spec + "'");
    if (ropts.params.count(spec.substr(0, eq)))
      return usage("--param " + spec.substr(0, eq) + " is given twice");
    ropts.params[spec.substr(0, eq)] = spec.substr(eq + 1);
  }
  for (const auto& spec : node_addresses) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || spec.find(':', eq) == std::string::npos)
      return usage("--node takes NAME=HOST:PORT, got '" + spec + "'");
    ropts.nodes[spec.substr(0, eq)] = spec.substr(eq + 1);
  }
  if (*run && (num_devices_opt->count() > 0 || queue_capacity_opt->count() > 0))
    return usage("run takes its devices from the script's (devices N ...) form; -n and "
                 "--queue-capacity do not apply to it");
  // An output file that cannot be written is found now, not after the run.
  if (*run)
    if (auto bad = multidev::tools::check_outputs(ropts))
      return usage(*bad);
  if (repeats_opt->count() > 0) {
    if (auto bad = read_count("--repeats", repeats, 1, 1'000'000, count))
      return usage(*bad);
    bopts.repeats = static_cast<int>(count);
  }

  bool use_tls = !tls.certificate.empty() || !tls.key.empty() || !tls.ca_file.empty();
  if (use_tls) {
    if (tls.certificate.empty() || tls.key.empty() || tls.ca_file.empty())
      return usage("TLS needs all three of --tls-cert, --tls-key and --tls-ca");
    // The nodes a run starts speak TLS with the same files.
    ropts.node_args = {"--tls-cert", tls.certificate, "--tls-key", tls.key, "--tls-ca",
                       tls.ca_file};
  }
  if (!cookie_file.empty()) {
    // The nodes a run starts ask for the same cookie.
    ropts.node_args.insert(ropts.node_args.end(), {"--cookie-file", cookie_file});
    ropts.cookie_file = cookie_file;
    nopts.cookie_file = cookie_file;
  }
  // A cookie file that cannot be used is named now (made on first use).
  if (*node || (*run && (ropts.spawn_nodes || !ropts.nodes.empty()))) {
    try {
      multidev::load_cookie(cookie_file);
    } catch (const std::invalid_argument& e) {
      return usage(e.what());
    }
  }

  // The long options that apply: the top level's and the given command's.
  std::vector<std::string> known_options;
  auto add_options = [&](const CLI::App& a) {
    for (const auto* opt : a.get_options())
      for (const auto& name : opt->get_lnames())
        known_options.push_back("--" + name);
  };
  add_options(app);
  for (const auto* sub : app.get_subcommands())
    add_options(*sub);
  tool_config cfg;
  if (auto err = configure_caf(cfg, app.remaining(true), app.get_subcommands().size() > 0,
                               std::move(known_options)))
    return usage(*err);
  if (use_tls) {
    try {
      multidev::configure_tls(cfg, tls);
    } catch (const std::invalid_argument& e) {
      return usage(e.what());
    }
  }
  if (app.get_subcommands().empty())
    return usage("a command is required: devices, kernels, run, node or bench");

  try {
    if (*devices) {
      caf::actor_system sys{cfg};
      opts.driver = backend_kind;
      multidev::backend b{sys, opts};
      // For a reader on a terminal: indented, a device a line. For a pipe or
      // a file: one s-expression a line, as scripts read it.
      auto print = [](const multidev::sexp& x) {
        if (isatty(STDOUT_FILENO) == 0)
          return x.to_string();
        winsize ws{};
        std::size_t width = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0
                              ? ws.ws_col
                              : 80;
        return multidev::tools::pretty_sexp(x, width);
      };
      std::cout << print(b.static_properties()) << "\n";
      if (limits)
        std::cout << print(to_sexp(b.hardware_limits())) << "\n";
      return 0;
    }
    if (*kernels) {
      for (const auto& name : multidev::kernel_names())
        std::cout << multidev::find_kernel(name)->doc << "\n";
      return 0;
    }
    if (*node) {
      // Blocked before the actor system starts its threads, which inherit
      // the mask: serve_node takes them with sigwait.
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGINT);
      sigaddset(&set, SIGTERM);
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
      caf::actor_system sys{cfg};
      return multidev::tools::serve_node(sys, nopts);
    }
    if (*run) {
      caf::actor_system sys{cfg};
      return multidev::tools::run_scenario(sys, ropts);
    }
    if (*bench) {
      auto results = multidev::tools::run_benchmarks(opts, bopts);
      std::cout << multidev::tools::format_table(results);
      if (!json_file.empty()) {
        std::ofstream out{json_file};
        out << multidev::tools::to_json(results) << "\n";
        if (!out) {
          std::cerr << "multidev bench: cannot write " << json_file << "\n";
          return 1;
        }
      }
      if (!plot_dir.empty())
        for (const auto& f : multidev::tools::write_plots(results, plot_dir))
          std::cout << "wrote " << f << "\n";
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "multidev: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
