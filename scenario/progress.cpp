// The live progress line `multidev run` redraws on a terminal.
#include "scenario/scenario.hpp"

#include <fmt/format.h>

namespace multidev::scenario {

std::string elapsed_text(double seconds) {
  if (!(seconds >= 0))
    seconds = 0;
  if (seconds < 60)
    return fmt::format("{:.1f} s", seconds);
  auto whole = static_cast<uint64_t>(seconds);
  if (whole < 3600)
    return fmt::format("{} min {:02} s", whole / 60, whole % 60);
  return fmt::format("{} h {:02} min", whole / 3600, whole / 60 % 60);
}

std::string progress_line(const std::vector<device_progress>& devices, double elapsed_s,
                          std::size_t width) {
  // The last column stays empty: a line that fills it makes some terminals
  // wrap, and the next redraw would then leave it behind.
  std::size_t room = width > 1 ? width - 1 : 1;
  uint64_t done = 0, scheduled = 0;
  for (const auto& p : devices) {
    done += p.done;
    scheduled += p.scheduled;
  }
  auto line = fmt::format("{}  {}/{} items done", elapsed_text(elapsed_s), done, scheduled);
  // Then each device, while it fits; "  ..." when some do not.
  const std::string more = "  ...";
  for (std::size_t d = 0; d < devices.size(); ++d) {
    auto part = fmt::format("  d{} {}/{}", d, devices[d].done, devices[d].scheduled);
    bool last = d + 1 == devices.size();
    if (line.size() + part.size() + (last ? 0 : more.size()) > room) {
      if (line.size() + more.size() <= room)
        line += more;
      break;
    }
    line += part;
  }
  if (line.size() > room)
    line.resize(room);
  return line;
}

} // namespace multidev::scenario
