// multidev: the command-line tool. `multidev --help` lists the commands.
#include <CLI/CLI.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <fstream>
#include <iostream>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "bench.hpp"

namespace {

/// CAF's own options (`--scheduler.max-threads=2`, also spelled
/// `--caf.scheduler.max-threads=2`; `--config-file=F`) go to CAF's config.
int configure_caf(caf::actor_system_config& cfg, std::vector<std::string> extras) {
  multidev::register_types(cfg);
  cfg.set("scheduler.max-threads",
          static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency())));
  for (auto& a : extras)
    if (a.rfind("--caf.", 0) == 0)
      a = "--" + a.substr(6);
  std::string given;
  for (const auto& a : extras)
    given += (given.empty() ? "" : " ") + a;
  if (auto err = cfg.parse(std::move(extras))) {
    std::cerr << "multidev: unknown or malformed option among: " << given
              << "\n  (multidev's options: see --help; CAF's look like "
                 "--scheduler.max-threads=2)\n  CAF said: "
              << caf::to_string(err) << "\n";
    return 2;
  }
  if (!cfg.remainder.empty()) {
    std::cerr << "multidev: unknown option '" << cfg.remainder.front()
              << "' (see multidev --help)\n";
    return 2;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"multidev: a task runtime for many devices (OCANNL's Multidev interface "
               "on CAF actors).\nCAF options pass through, e.g. "
               "--scheduler.max-threads=2 or --caf.scheduler.max-threads=2."};
  app.require_subcommand(1);
  app.allow_extras();
  multidev::backend_options opts;
  int num_devices = 0;
  app.add_option("-n,--num-devices", num_devices,
                 "number of CPU devices (default: hardware threads)")
    ->check(CLI::NonNegativeNumber);
  app.add_option("--queue-capacity", opts.queue_capacity,
                 "tasks a device queues before schedule_task waits for room")
    ->check(CLI::PositiveNumber);

  auto* devices = app.add_subcommand("devices", "print the devices' static properties as an s-expression");
  devices->allow_extras();
  bool limits = false;
  devices->add_flag("--limits", limits, "also print hardware_limits");

  auto* kernels = app.add_subcommand("kernels", "list the named kernels");
  kernels->allow_extras();

  auto* bench = app.add_subcommand(
    "bench", "run the benchmark suite; each figure beside a baseline measured in the same run");
  bench->allow_extras();
  multidev::tools::bench_options bopts;
  std::string json_file;
  bench->add_option("--json", json_file,
                    "write the results as a JSON array of {name, unit, value, baseline, "
                    "baseline_value, ratio, better, target, meets_target}");
  bench->add_flag("--quick", bopts.quick, "fewer iterations (noisier)");
  bench->add_option("--filter", bopts.filter, "only benchmarks whose name contains this");
  bench->add_option("--repeats", bopts.repeats, "repetitions per figure (median reported)")
    ->check(CLI::PositiveNumber);

  CLI11_PARSE(app, argc, argv);
  if (num_devices > 0)
    opts.num_devices = num_devices;

  std::vector<std::string> extras = app.remaining(true);
  caf::actor_system_config cfg;
  if (int rc = configure_caf(cfg, extras); rc != 0)
    return rc;

  try {
    if (*devices) {
      caf::actor_system sys{cfg};
      multidev::backend b{sys, opts};
      std::cout << b.static_properties().to_string() << "\n";
      if (limits)
        std::cout << to_sexp(b.hardware_limits()).to_string() << "\n";
      return 0;
    }
    if (*kernels) {
      for (const auto& name : multidev::kernel_names())
        std::cout << multidev::find_kernel(name)->doc << "\n";
      return 0;
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
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "multidev: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
