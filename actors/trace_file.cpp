// A backend's timeline (its devices' traces, local and attached), the
// public writers, and the trace file `MULTIDEV_TRACE` names, written when
// the backend is destroyed.
#include "actors/backend_impl.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

#include "devices/driver.hpp"

namespace multidev::detail {

namespace {

/// Records each device keeps when `MULTIDEV_TRACE` turns tracing on.
constexpr std::size_t env_trace_capacity = std::size_t{1} << 16;

/// `path` with `%p` replaced by the process id and, for the `n`th backend
/// of the process given it (from 0), `.n` before the extension:
/// `run.json`, `run.1.json`, `run.2.json`...
std::string numbered(std::string path, int n) {
  for (auto at = path.find("%p"); at != std::string::npos; at = path.find("%p", at))
    path.replace(at, 2, std::to_string(getpid()));
  if (n == 0)
    return path;
  auto slash = path.rfind('/');
  auto dot = path.rfind('.');
  bool has_ext = dot != std::string::npos && dot != 0
                 && (slash == std::string::npos || dot > slash + 1);
  auto suffix = "." + std::to_string(n);
  return has_ext ? path.substr(0, dot) + suffix + path.substr(dot) : path + suffix;
}

bool is_svg(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".svg") == 0;
}

/// The devices a timeline of `impl` shows, in order, with their lanes: the
/// ones `get_device` returned (by ordinal), then the other attached ones.
std::vector<std::pair<std::string, device>> traced_devices(const backend_impl& impl) {
  std::vector<std::pair<std::string, device>> out;
  std::lock_guard guard{impl.mu};
  std::set<device_key> seen;
  auto local = impl.drv->device_count();
  for (std::size_t i = 0; i < impl.devices.size(); ++i)
    if (const auto& d = impl.devices[i])
      out.emplace_back(fmt::format("device {} ({})", i, d.name()), d);
  for (std::size_t i = 0; i < impl.node_devices.size(); ++i) {
    const auto& d = impl.node_devices[i];
    seen.insert(record_of(d).r.key());
    out.emplace_back(fmt::format("device {} ({})", local + static_cast<int>(i), d.name()), d);
  }
  for (const auto& [key, d] : impl.attached)
    if (!seen.contains(key))
      out.emplace_back(fmt::format("attached ({})", d.name()), d);
  return out;
}

/// The timeline of `impl`'s devices, each device's trace from `trace_of`.
timeline timeline_of(const backend_impl& impl,
                     const std::function<device_trace(const device&)>& trace_of) {
  auto devices = traced_devices(impl);
  std::vector<device_trace> traces;
  traces.reserve(devices.size());
  for (const auto& [lane, d] : devices)
    traces.push_back(trace_of(d));
  auto tl = make_timeline(traces);
  for (std::size_t i = 0; i < devices.size(); ++i)
    tl.lanes[i] = devices[i].first;
  const auto& name = impl.drv->backend_name();
  tl.title = fmt::format("{}: {} device(s), process {}", name, devices.size(), getpid());
  tl.info = {{"backend", name}, {"process", std::to_string(getpid())}};
  for (const auto& t : traces)
    if (!t.unreachable.empty())
      tl.info.emplace_back(t.device, "records unreadable: " + t.unreachable);
  return tl;
}

/// `text` into the file at `path`, replaced; `what` names the caller in the
/// error thrown when it cannot be written.
void write_file(const std::string& path, const std::string& text, const char* what) {
  errno = 0;
  std::ofstream f{path, std::ios::binary | std::ios::trunc};
  if (f)
    f << text;
  if (f)
    f.flush();
  if (!f)
    throw std::runtime_error(fmt::format("{}: cannot write '{}': {}", what, path,
                                         errno != 0 ? std::strerror(errno) : "write failed"));
}

} // namespace

std::string trace_file_from_environment(backend_options& opts) noexcept {
  // Backends that took a file so far, by the variable's value.
  static std::mutex mu;
  static std::map<std::string, int> taken;
  try {
    const char* env = std::getenv("MULTIDEV_TRACE");
    if (env == nullptr || *env == '\0' || opts.trace_capacity != 0)
      return {};
    std::string path;
    {
      std::lock_guard guard{mu};
      path = numbered(env, taken[env]++);
    }
    // Found now, not after the whole run: the file is made (empty) here.
    errno = 0;
    std::ofstream probe{path, std::ios::binary | std::ios::trunc};
    if (!probe) {
      std::cerr << fmt::format("multidev: MULTIDEV_TRACE: cannot write '{}': {}; this "
                               "backend writes no trace\n",
                               path, errno != 0 ? std::strerror(errno) : "open failed");
      return {};
    }
    opts.trace_capacity = env_trace_capacity;
    return path;
  } catch (...) {
    return {}; // out of memory: no trace, the backend still works
  }
}

void backend_impl::read_remote_traces() noexcept {
  if (trace_file.empty() || remote_traces_read || teardown_waits_for_this_thread())
    return;
  remote_traces_read = true;
  try {
    std::vector<device> remote;
    {
      std::lock_guard guard{mu};
      for (const auto& [key, d] : attached)
        remote.push_back(d);
    }
    for (const auto& d : remote) {
      auto& rec = record_of(d);
      device_trace t;
      try {
        t = rec.ep().trace();
      } catch (const std::exception& e) {
        t.device = d.name();
        t.unreachable = e.what();
      }
      last_remote_traces.emplace(rec.r.key(), std::move(t));
    }
  } catch (...) {
    // Out of memory: the file goes without them.
  }
}

void backend_impl::write_trace_file() noexcept {
  if (trace_file.empty())
    return;
  try {
    auto tl = timeline_of(*this, [this](const device& d) {
      auto& rec = record_of(d);
      if (rec.r.is_local())
        return rec.ep().trace();
      if (auto i = last_remote_traces.find(rec.r.key()); i != last_remote_traces.end())
        return i->second;
      device_trace t;
      t.device = d.name();
      t.unreachable = "not read: the backend was destroyed on one of its own threads";
      return t;
    });
    write_file(trace_file, is_svg(trace_file) ? timeline_svg(tl) : chrome_trace_json(tl),
               "MULTIDEV_TRACE");
  } catch (const std::exception& e) {
    try {
      std::cerr << "multidev: " << e.what() << "\n";
    } catch (...) {
    }
  } catch (...) {
  }
}

} // namespace multidev::detail

namespace multidev {

timeline make_timeline(const backend& b) {
  const auto& impl = b.impl();
  if (impl.opts.trace_capacity == 0)
    throw std::invalid_argument(fmt::format(
      "make_timeline: tracing is off for this backend ({}): set "
      "backend_options::trace_capacity, or MULTIDEV_TRACE in the environment",
      b.name()));
  return detail::timeline_of(impl, [](const device& d) { return detail::record_of(d).ep().trace(); });
}

void write_chrome_trace(const backend& b, std::ostream& out) {
  out << chrome_trace_json(make_timeline(b));
}

void write_chrome_trace(const backend& b, const std::string& path) {
  auto text = chrome_trace_json(make_timeline(b));
  detail::write_file(path, text, "write_chrome_trace");
}

void write_timeline_svg(const backend& b, std::ostream& out) {
  out << timeline_svg(make_timeline(b));
}

void write_timeline_svg(const backend& b, const std::string& path) {
  auto text = timeline_svg(make_timeline(b));
  detail::write_file(path, text, "write_timeline_svg");
}

} // namespace multidev
