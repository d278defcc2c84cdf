// What a run is turned into: the timeline (shared by the Chrome trace and
// the SVG), the logical trace, the human summary and the s-expression report.
#include "scenario/record.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace multidev::scenario {


timeline make_timeline(const run_record& rec, int devices) {
  // The devices' lanes, items and gates; the host lane is the script's.
  auto tl = multidev::make_timeline(rec.traces, false);
  tl.start_ns = rec.start_ns;
  tl.end_ns = std::max(tl.end_ns, rec.start_ns);
  tl.lanes.push_back("host (the script)");
  // Slice index of (device, seq), and the event names the script gave.
  std::vector<std::map<uint64_t, std::size_t>> index(devices);
  std::vector<std::map<uint64_t, const model_item*>> items(devices);
  for (int d = 0; d < devices; ++d)
    for (const auto& it : rec.model[d])
      if (it.seq != 0)
        items[d][it.seq] = &it;
  for (std::size_t i = 0; i < tl.slices.size(); ++i) {
    auto& s = tl.slices[i];
    if (s.kind == "lost")
      continue;
    index[s.lane][s.seq] = i;
    // The script's words for the item ("scale w 2"), where it has them.
    if (auto it = items[s.lane].find(s.seq); it != items[s.lane].end()) {
      if (s.kind != "cancel")
        s.name = it->second->description;
      s.event = it->second->event;
    }
  }
  for (const auto& h : rec.host_slices) {
    tl.end_ns = std::max(tl.end_ns, h.end_ns);
    tl.slices.push_back(h);
  }
  // The script's cross-device edges (waits, copies) that queued no gate
  // because the awaited item was done already: the arrow goes to the
  // waiting device's next item.
  for (const auto& e : rec.edges) {
    if (e.from_device == e.to_device)
      continue;
    const auto& waiter = rec.model[e.to_device];
    const auto& owner = rec.model[e.from_device][e.from_item];
    auto from = index[e.from_device].find(owner.seq);
    if (owner.seq == 0 || from == index[e.from_device].end())
      continue;
    for (auto i = static_cast<std::size_t>(e.to_item); i < waiter.size(); ++i) {
      auto seq = waiter[i].seq;
      if (seq == 0)
        continue; // a wait that queued nothing: its device's next item
      auto to = index[e.to_device].find(seq);
      if (to == index[e.to_device].end())
        break;
      // A gate on the awaited device right before it is drawn already.
      auto gate = index[e.to_device].find(seq - (waiter[i].kind == "gate" ? 0 : 1));
      bool gated = gate != index[e.to_device].end()
                   && tl.slices[gate->second].kind == "gate";
      if (!gated)
        tl.flows.push_back(flow{e.from_device, tl.slices[from->second].end_ns, e.to_device,
                                tl.slices[to->second].start_ns, e.kind, from->second,
                                to->second});
      break;
    }
  }
  return tl;
}

sexp make_logical(const run_record& rec, const run_result& r) {
  int devices = static_cast<int>(rec.model.size());
  // Lamport clocks, in script order: one more than the device's previous
  // item and than every item it waits for.
  std::vector<std::vector<uint64_t>> clock(devices);
  for (int d = 0; d < devices; ++d)
    clock[d].assign(rec.model[d].size(), 0);
  std::vector<std::vector<const model_edge*>> into(devices);
  std::vector<std::pair<uint64_t, std::pair<int, int>>> order;
  for (int d = 0; d < devices; ++d) {
    into[d].resize(0);
    for (std::size_t i = 0; i < rec.model[d].size(); ++i)
      order.push_back({rec.model[d][i].order, {d, static_cast<int>(i)}});
  }
  std::sort(order.begin(), order.end());
  std::map<std::pair<int, int>, std::vector<const model_edge*>> edges_to;
  for (const auto& e : rec.edges)
    edges_to[{e.to_device, e.to_item}].push_back(&e);
  for (const auto& [_, at] : order) {
    auto [d, i] = at;
    uint64_t c = i > 0 ? clock[d][i - 1] : 0;
    if (auto it = edges_to.find(at); it != edges_to.end())
      for (const auto* e : it->second)
        c = std::max(c, clock[e->from_device][e->from_item]);
    clock[d][i] = c + 1;
  }
  sexp out = sexp::list({sexp::atom("logical-trace")});
  out.push_back(sexp::field("scenario", r.scenario));
  out.push_back(sexp::field("seed", std::to_string(r.seed)));
  out.push_back(sexp::field("backend", r.backend));
  out.push_back(sexp::field("devices", std::to_string(devices)));
  for (int d = 0; d < devices; ++d) {
    sexp dev = sexp::list({sexp::atom("device"), sexp::atom(std::to_string(d))});
    for (std::size_t i = 0; i < rec.model[d].size(); ++i) {
      const auto& it = rec.model[d][i];
      sexp item = sexp::list({sexp::atom("item")});
      item.push_back(sexp::field("step", std::to_string(i + 1)));
      item.push_back(sexp::field("clock", std::to_string(clock[d][i])));
      item.push_back(sexp::field("kind", it.kind));
      item.push_back(sexp::field("description", it.description));
      if (!it.event.empty())
        item.push_back(sexp::field("event", it.event));
      item.push_back(sexp::field("line", std::to_string(it.where.line)));
      dev.push_back(std::move(item));
    }
    out.push_back(std::move(dev));
  }
  sexp edges = sexp::list({sexp::atom("edges")});
  for (const auto& e : rec.edges) {
    edges.push_back(sexp::list(
      {sexp::atom("edge"),
       sexp::list({sexp::atom("from"), sexp::atom(std::to_string(e.from_device)),
                   sexp::atom(std::to_string(e.from_item + 1))}),
       sexp::list({sexp::atom("to"), sexp::atom(std::to_string(e.to_device)),
                   sexp::atom(std::to_string(e.to_item + 1))}),
       sexp::field("kind", e.kind)}));
  }
  out.push_back(std::move(edges));
  return out;
}

std::string logical_trace(const run_result& r) {
  // One line per header field, item and edge, so diffs point at an item.
  std::string out = "(logical-trace\n";
  const auto& xs = r.logical.items();
  for (std::size_t i = 1; i < xs.size(); ++i) {
    const auto& x = xs[i];
    const auto& head = x.items()[0].as_atom();
    if (head == "device" || head == "edges") {
      out += fmt::format(" ({}{}", head, head == "device" ? " " + x.items()[1].as_atom() : "");
      for (std::size_t j = head == "device" ? 2 : 1; j < x.items().size(); ++j)
        out += "\n  " + x.items()[j].to_string();
      out += ")\n";
    } else {
      out += " " + x.to_string() + "\n";
    }
  }
  return out + ")\n";
}

std::string summary(const run_result& r) {
  std::string out;
  uint64_t items = 0;
  for (auto n : r.items)
    items += n;
  std::size_t held = 0;
  for (const auto& e : r.expectations)
    held += e.held;
  out += fmt::format("scenario {}: {} device(s) ({}), {} item(s), seed {}, {:.1f} ms\n",
                     r.scenario, r.devices, r.backend, items, r.seed,
                     static_cast<double>(r.wall_ns) / 1e6);
  for (const auto& e : r.expectations)
    if (!e.held)
      out += fmt::format("  FAILED {}: {}\n    observed: {}\n", e.where.str(), e.text, e.observed);
  // The first few: one failure can poison thousands of items (the report
  // lists them all).
  constexpr std::size_t shown = 20;
  for (std::size_t i = 0; i < r.unexpected.size() && i < shown; ++i) {
    const auto& e = r.unexpected[i];
    out += fmt::format("  UNEXPECTED {}: {}\n    {}\n", e.where.str(), e.text, e.observed);
  }
  if (r.unexpected.size() > shown)
    out += fmt::format("  ... and {} more unexpected failure(s) (the report lists them all)\n",
                       r.unexpected.size() - shown);
  if (r.dropped_records > 0)
    out += fmt::format("  note: the traces dropped {} record(s)\n", r.dropped_records);
  out += fmt::format("{}: {} of {} expectation(s) held{}\n", r.ok() ? "PASSED" : "FAILED", held,
                     r.expectations.size(),
                     r.unexpected.empty() ? ""
                                          : fmt::format(", {} unexpected failure(s)",
                                                        r.unexpected.size()));
  return out;
}

sexp report(const run_result& r) {
  auto expectation = [](const char* head, const expectation_result& e) {
    return sexp::list({sexp::atom(head), sexp::field("where", e.where.str()),
                       sexp::field("text", e.text),
                       sexp::field("held", e.held ? "true" : "false"),
                       sexp::field("observed", e.observed)});
  };
  sexp out = sexp::list({sexp::atom("report")});
  out.push_back(sexp::field("scenario", r.scenario));
  out.push_back(sexp::field("file", r.file));
  out.push_back(sexp::field("seed", std::to_string(r.seed)));
  out.push_back(sexp::field("backend", r.backend));
  out.push_back(sexp::field("verdict", r.ok() ? "passed" : "failed"));
  out.push_back(sexp::field("wall_ns", std::to_string(r.wall_ns)));
  sexp ex = sexp::list({sexp::atom("expectations")});
  for (const auto& e : r.expectations)
    ex.push_back(expectation("expect", e));
  out.push_back(std::move(ex));
  sexp un = sexp::list({sexp::atom("unexpected")});
  for (const auto& e : r.unexpected)
    un.push_back(expectation("step", e));
  out.push_back(std::move(un));
  sexp devs = sexp::list({sexp::atom("devices")});
  for (int d = 0; d < r.devices; ++d) {
    std::size_t lane_slices = 0;
    for (const auto& s : r.tl.slices)
      lane_slices += s.lane == d;
    devs.push_back(sexp::list({sexp::atom("device"), sexp::atom(std::to_string(d)),
                               sexp::field("name", r.tl.lanes[d]),
                               sexp::field("items", std::to_string(r.items[d])),
                               sexp::field("records", std::to_string(lane_slices))}));
  }
  out.push_back(std::move(devs));
  out.push_back(sexp::field("dropped_records", std::to_string(r.dropped_records)));
  return out;
}

namespace {

/// The run's timeline with its heading and the Chrome trace's `otherData`.
timeline titled(const run_result& r) {
  auto tl = r.tl;
  tl.title = fmt::format("multidev run {} — {} ({} device(s), seed {})", r.scenario,
                         r.ok() ? "passed" : "failed", r.devices, r.seed);
  tl.info = {{"scenario", r.scenario}, {"seed", std::to_string(r.seed)},
             {"backend", r.backend}, {"verdict", r.ok() ? "passed" : "failed"}};
  return tl;
}

} // namespace

std::string chrome_trace_json(const run_result& r) {
  return multidev::chrome_trace_json(titled(r));
}

std::string timeline_svg(const run_result& r) {
  return multidev::timeline_svg(titled(r));
}

} // namespace multidev::scenario
