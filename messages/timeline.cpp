// Device traces turned into a timeline (lanes, slices, arrows), and the
// timeline as Chrome trace-event JSON. The SVG is timeline_svg.cpp.
#include "multidev/trace.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <map>

namespace multidev {

namespace {

/// The slice of `index` (seq -> slice) whose item is `seq`, or the last one
/// before it (an `await` waits for everything up to its seq, which may be
/// a record the ring no longer holds or one not yet written); SIZE_MAX when
/// none.
std::size_t slice_at_or_before(const std::map<uint64_t, std::size_t>& index, uint64_t seq) {
  auto it = index.upper_bound(seq);
  if (it == index.begin())
    return SIZE_MAX;
  return std::prev(it)->second;
}

} // namespace

timeline make_timeline(const std::vector<device_trace>& traces, bool host_waits) {
  timeline tl;
  auto devices = static_cast<int>(traces.size());
  for (int d = 0; d < devices; ++d)
    tl.lanes.push_back(fmt::format("device {} ({})", d, traces[d].device));
  // The slice of each (device, seq).
  std::vector<std::map<uint64_t, std::size_t>> index(devices);
  for (int d = 0; d < devices; ++d) {
    for (const auto& r : traces[d].records) {
      index[d][r.seq] = tl.slices.size();
      tl.slices.push_back(timeline_slice{d, r.description, to_string(r.kind), r.start_ns,
                                         std::max(r.end_ns, r.start_ns), r.failed, r.seq, {}});
    }
    for (const auto& h : traces[d].host)
      if (h.kind == host_span_kind::node_lost)
        tl.slices.push_back(timeline_slice{d, h.description, "lost", h.start_ns,
                                           std::max(h.end_ns, h.start_ns), true, 0, {}});
  }
  auto lane_of = [&](const std::string& name) {
    for (int d = 0; d < devices; ++d)
      if (traces[d].device == name)
        return d;
    return -1;
  };
  auto add_flow = [&](std::size_t from, std::size_t to) {
    const auto& a = tl.slices[from];
    const auto& b = tl.slices[to];
    tl.flows.push_back(timeline_flow{a.lane, a.end_ns, b.lane, std::max(b.end_ns, b.start_ns),
                                     "wait", from, to});
  };
  // Every gate: from the awaited item to the gate.
  for (int d = 0; d < devices; ++d)
    for (const auto& r : traces[d].records) {
      if (r.kind != trace_kind::gate)
        continue;
      int o = lane_of(r.awaited_device);
      if (o < 0)
        continue;
      if (auto from = index[o].find(r.awaited_seq); from != index[o].end())
        add_flow(from->second, index[d][r.seq]);
    }
  if (host_waits) {
    // A lane per host thread, in the order of their numbers.
    std::map<uint64_t, int> lane_of_thread;
    for (const auto& t : traces)
      for (const auto& h : t.host)
        if (h.kind == host_span_kind::wait)
          lane_of_thread.emplace(h.thread, 0);
    for (auto& [thread, lane] : lane_of_thread) {
      lane = static_cast<int>(tl.lanes.size());
      tl.lanes.push_back(fmt::format("host thread {}", thread));
    }
    for (int d = 0; d < devices; ++d)
      for (const auto& h : traces[d].host) {
        if (h.kind != host_span_kind::wait)
          continue;
        auto to = tl.slices.size();
        tl.slices.push_back(timeline_slice{lane_of_thread.at(h.thread), h.description, "host",
                                           h.start_ns, std::max(h.end_ns, h.start_ns), h.failed,
                                           h.seq, {}});
        if (auto from = slice_at_or_before(index[d], h.seq); from != SIZE_MAX)
          add_flow(from, to);
      }
  }
  if (!tl.slices.empty()) {
    tl.start_ns = INT64_MAX;
    tl.end_ns = INT64_MIN;
    for (const auto& s : tl.slices) {
      tl.start_ns = std::min(tl.start_ns, s.start_ns);
      tl.end_ns = std::max(tl.end_ns, s.end_ns);
    }
  }
  return tl;
}

std::string chrome_trace_json(const timeline& tl) {
  using nlohmann::json;
  json events = json::array();
  auto us = [&](int64_t ns) { return static_cast<double>(ns - tl.start_ns) / 1000.0; };
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 1},
                    {"args", {{"name", tl.title}}}});
  for (std::size_t l = 0; l < tl.lanes.size(); ++l) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", l},
                      {"args", {{"name", tl.lanes[l]}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 1}, {"tid", l},
                      {"args", {{"sort_index", l}}}});
  }
  for (const auto& s : tl.slices) {
    json args = {{"seq", s.seq}, {"kind", s.kind}};
    if (!s.event.empty())
      args["event"] = s.event;
    if (s.failed)
      args["failed"] = true;
    events.push_back({{"ph", "X"}, {"name", s.name}, {"cat", s.kind}, {"pid", 1},
                      {"tid", s.lane}, {"ts", us(s.start_ns)},
                      {"dur", static_cast<double>(s.end_ns - s.start_ns) / 1000.0},
                      {"args", args}});
  }
  // A flow starts inside the awaited slice and ends on the slice that waited
  // ("bp": "e" binds the end to the slice enclosing its timestamp).
  // Both ends sit inside their slices (an end on a boundary binds to no
  // slice): near the awaited item's end, and near the end of a wait (a
  // gate, a host thread's wait: when the wait was over) or another item's
  // start.
  auto inside = [](const timeline_slice& s, bool near_end) {
    auto dur = s.end_ns - s.start_ns;
    return near_end ? s.end_ns - dur / 20 : s.start_ns + dur / 20;
  };
  uint64_t id = 1;
  for (const auto& f : tl.flows) {
    const auto& a = tl.slices[f.from_slice];
    const auto& b = tl.slices[f.to_slice];
    events.push_back({{"ph", "s"}, {"name", "wait"}, {"cat", "dependency"}, {"id", id},
                      {"pid", 1}, {"tid", f.from_lane}, {"ts", us(inside(a, true))}});
    events.push_back({{"ph", "f"}, {"bp", "e"}, {"name", "wait"}, {"cat", "dependency"},
                      {"id", id}, {"pid", 1}, {"tid", f.to_lane},
                      {"ts", us(inside(b, b.kind == "gate" || b.kind == "host"))}});
    ++id;
  }
  json other = json::object();
  for (const auto& [name, value] : tl.info)
    other[name] = value;
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ns"}, {"otherData", other}};
  return doc.dump(1) + "\n";
}

} // namespace multidev
