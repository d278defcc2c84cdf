// What a run is turned into: the timeline (shared by the Chrome trace and
// the SVG), the logical trace, the human summary and the s-expression report.
#include "scenario/record.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string_view>

namespace multidev::scenario {

namespace {

bool is_gate(const model_item& it) {
  return std::string_view{it.kind} == "gate";
}

/// Lane `d` of the timeline, as `multidev::make_timeline` names it.
std::string lane_name(const run_record& rec, int d) {
  return fmt::format("device {} ({})", d, rec.traces[static_cast<std::size_t>(d)].device);
}

} // namespace

std::size_t bytes_of(const run_record& rec) {
  auto text = [](const std::string& t) {
    return sizeof t + (t.capacity() > 15 ? t.capacity() + 1 : 0);
  };
  std::size_t n = sizeof rec;
  for (const auto& t : rec.traces) {
    n += t.records.capacity() * sizeof(trace_record) + t.host.capacity() * sizeof(host_span);
    for (const auto& r : t.records)
      n += text(r.description) - sizeof(std::string) + text(r.awaited_device)
           - sizeof(std::string);
  }
  n += rec.host_slices.capacity() * sizeof(slice);
  for (const auto& m : rec.model)
    n += sizeof m + m.capacity() * sizeof(model_item);
  n += rec.edges.capacity() * sizeof(model_edge);
  for (const auto& t : rec.texts)
    n += text(t);
  for (const auto& t : rec.event_names)
    n += text(t);
  return n;
}


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
        s.name = rec.description(*it->second);
      s.event = rec.event(*it->second);
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
      auto gate = index[e.to_device].find(seq - (is_gate(waiter[i]) ? 0 : 1));
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
      item.push_back(sexp::field("description", rec.description(it)));
      if (it.replay > 0)
        item.push_back(sexp::field("replay", std::to_string(it.replay)));
      if (it.event >= 0)
        item.push_back(sexp::field("event", rec.event(it)));
      item.push_back(sexp::field("line", std::to_string(it.line)));
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
  // Not built with the run (run_options::timeline false): built now.
  sexp built;
  if (r.logical.items().empty() && r.record)
    built = make_logical(*r.record, r);
  const auto& xs = (r.logical.items().empty() && r.record ? built : r.logical).items();
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
  bool drawn = !r.tl.lanes.empty() || !r.record;
  for (int d = 0; d < r.devices; ++d) {
    // The slices of its lane: a record each, and its node's losses.
    std::size_t lane_slices = 0;
    if (drawn) {
      for (const auto& s : r.tl.slices)
        lane_slices += s.lane == d;
    } else {
      const auto& t = r.record->traces[d];
      lane_slices = t.records.size();
      for (const auto& h : t.host)
        lane_slices += h.kind == host_span_kind::node_lost;
    }
    devs.push_back(sexp::list({sexp::atom("device"), sexp::atom(std::to_string(d)),
                               sexp::field("name", drawn ? r.tl.lanes[d] : lane_name(*r.record, d)),
                               sexp::field("items", std::to_string(r.items[d])),
                               sexp::field("records", std::to_string(lane_slices))}));
  }
  out.push_back(std::move(devs));
  out.push_back(sexp::field("dropped_records", std::to_string(r.dropped_records)));
  return out;
}

namespace {

std::string title_of(const run_result& r) {
  return fmt::format("multidev run {} — {} ({} device(s), seed {})", r.scenario,
                     r.ok() ? "passed" : "failed", r.devices, r.seed);
}

std::vector<std::pair<std::string, std::string>> info_of(const run_result& r) {
  return {{"scenario", r.scenario}, {"seed", std::to_string(r.seed)},
          {"backend", r.backend}, {"verdict", r.ok() ? "passed" : "failed"}};
}

/// The run's timeline with its heading and the Chrome trace's `otherData`;
/// drawn from the record now when the run did not build it.
timeline titled(const run_result& r) {
  auto tl = r.tl.lanes.empty() && r.record ? make_timeline(*r.record, r.devices) : r.tl;
  tl.title = title_of(r);
  tl.info = info_of(r);
  return tl;
}

} // namespace

std::string chrome_trace_json(const run_result& r) {
  if (r.tl.lanes.empty() && r.record) {
    std::ostringstream out;
    write_chrome_trace(r, out);
    return std::move(out).str();
  }
  return multidev::chrome_trace_json(titled(r));
}

std::string timeline_svg(const run_result& r) {
  return multidev::timeline_svg(titled(r));
}

} // namespace multidev::scenario

namespace multidev::scenario {

namespace {

/// Whether the non-zero seqs of `xs` rise (a device's records and items
/// always do within a session; a device of a node attached again numbers
/// from 1 again).
template <class T>
bool rising(const std::vector<T>& xs) {
  uint64_t last = 0;
  for (const auto& x : xs) {
    if (x.seq == 0)
      continue;
    if (x.seq <= last)
      return false;
    last = x.seq;
  }
  return true;
}

/// A device's records by seq, as a map from seq to the last record with it
/// would find them: a binary search when they rise, else such a map.
class record_index {
public:
  static constexpr std::size_t none = SIZE_MAX;

  explicit record_index(const std::vector<trace_record>& rs) : rs_(&rs), sorted_(rising(rs)) {
    for (std::size_t i = 0; i < rs.size() && !sorted_; ++i)
      map_[rs[i].seq] = i;
  }

  bool sorted() const { return sorted_; }

  std::size_t find(uint64_t seq) const {
    if (!sorted_) {
      auto it = map_.find(seq);
      return it == map_.end() ? none : it->second;
    }
    auto it = std::lower_bound(rs_->begin(), rs_->end(), seq,
                               [](const trace_record& r, uint64_t s) { return r.seq < s; });
    return it != rs_->end() && it->seq == seq ? static_cast<std::size_t>(it - rs_->begin())
                                              : none;
  }

private:
  const std::vector<trace_record>* rs_;
  bool sorted_ = true;
  std::map<uint64_t, std::size_t> map_;
};

/// A device's items by seq, asked for in rising seqs when `walk` (a cursor
/// moves along them), else in any order (a map of the last item of each
/// seq).
class item_index {
public:
  item_index(const std::vector<model_item>& items, bool walk) : items_(&items), walk_(walk) {
    for (const auto& it : items)
      if (!walk_ && it.seq != 0)
        map_[it.seq] = &it;
  }

  const model_item* find(uint64_t seq) {
    if (!walk_) {
      auto it = map_.find(seq);
      return it == map_.end() ? nullptr : it->second;
    }
    const auto& xs = *items_;
    while (next_ < xs.size() && (xs[next_].seq == 0 || xs[next_].seq < seq))
      ++next_;
    return next_ < xs.size() && xs[next_].seq == seq ? &xs[next_] : nullptr;
  }

private:
  const std::vector<model_item>* items_;
  bool walk_;
  std::size_t next_ = 0;
  std::map<uint64_t, const model_item*> map_;
};

/// `x.dump(1)` with each line after the first indented `depth` more.
void put_indented(std::ostream& out, const nlohmann::json& x, std::size_t depth) {
  auto text = x.dump(1);
  std::string pad(depth, ' ');
  std::size_t from = 0;
  for (auto nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', from)) {
    out.write(text.data() + from, static_cast<std::streamsize>(nl + 1 - from));
    out << pad;
    from = nl + 1;
  }
  out.write(text.data() + from, static_cast<std::streamsize>(text.size() - from));
}

/// `json(s).dump()`: plain ASCII written as it is, anything else escaped
/// by nlohmann.
void put_string(std::string& out, const std::string& s) {
  bool plain = std::all_of(s.begin(), s.end(), [](char c) {
    return c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
  });
  if (!plain) {
    out += nlohmann::json(s).dump();
    return;
  }
  out += '"';
  out += s;
  out += '"';
}

/// `json(x).dump()` of a finite double: nlohmann's own conversion (its
/// serializer calls the same), so the text is the same to the digit.
void put_double(std::string& out, double x) {
  std::array<char, 64> buf{};
  auto* end = nlohmann::detail::to_chars(buf.data(), buf.data() + buf.size(), x);
  out.append(buf.data(), static_cast<std::size_t>(end - buf.data()));
}

} // namespace

void write_chrome_trace(const run_result& r, std::ostream& out) {
  if (!r.record || !r.tl.lanes.empty()) {
    out << multidev::chrome_trace_json(titled(r));
    return;
  }
  // What multidev::chrome_trace_json(titled(r)) writes, an event at a time:
  // the same slices and flows in the same order, read from the record.
  using nlohmann::json;
  const auto& rec = *r.record;
  auto devices = static_cast<int>(rec.traces.size());
  auto us = [&](int64_t ns) { return static_cast<double>(ns - rec.start_ns) / 1000.0; };
  std::vector<record_index> records;
  for (const auto& t : rec.traces)
    records.emplace_back(t.records);
  struct end_point {
    int lane;
    std::size_t record;
  };
  auto record_of = [&](const end_point& p) -> const trace_record& {
    return rec.traces[p.lane].records[p.record];
  };
  // The arrows: every gate's (from the awaited item), then the script's
  // edges that queued no gate (multidev::make_timeline, make_timeline).
  std::vector<std::pair<end_point, end_point>> flows;
  auto lane_of = [&](const std::string& name) {
    for (int d = 0; d < devices; ++d)
      if (rec.traces[d].device == name)
        return d;
    return -1;
  };
  for (int d = 0; d < devices; ++d) {
    const auto& rs = rec.traces[d].records;
    for (std::size_t k = 0; k < rs.size(); ++k) {
      if (rs[k].kind != trace_kind::gate)
        continue;
      int o = lane_of(rs[k].awaited_device);
      if (o < 0)
        continue;
      if (auto from = records[o].find(rs[k].awaited_seq); from != record_index::none)
        flows.push_back({{o, from}, {d, records[d].find(rs[k].seq)}});
    }
  }
  for (const auto& e : rec.edges) {
    if (e.from_device == e.to_device)
      continue;
    const auto& waiter = rec.model[e.to_device];
    const auto& owner = rec.model[e.from_device][e.from_item];
    auto from = records[e.from_device].find(owner.seq);
    if (owner.seq == 0 || from == record_index::none)
      continue;
    for (auto i = static_cast<std::size_t>(e.to_item); i < waiter.size(); ++i) {
      auto seq = waiter[i].seq;
      if (seq == 0)
        continue;
      auto to = records[e.to_device].find(seq);
      if (to == record_index::none)
        break;
      auto gate = records[e.to_device].find(seq - (is_gate(waiter[i]) ? 0 : 1));
      bool gated = gate != record_index::none
                   && rec.traces[e.to_device].records[gate].kind == trace_kind::gate;
      if (!gated)
        flows.push_back({{e.from_device, from}, {e.to_device, to}});
      break;
    }
  }

  json other = json::object();
  for (const auto& [name, value] : info_of(r))
    other[name] = value;
  out << "{\n \"displayTimeUnit\": \"ns\",\n \"otherData\": ";
  put_indented(out, other, 1);
  out << ",\n \"traceEvents\": [\n  ";
  bool first = true;
  auto put = [&](const json& x) {
    if (!first)
      out << ",\n  ";
    first = false;
    put_indented(out, x, 2);
  };
  put({{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", title_of(r)}}}});
  for (int l = 0; l <= devices; ++l) {
    auto name = l < devices ? lane_name(rec, l) : std::string{"host (the script)"};
    put({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", l},
         {"args", {{"name", name}}}});
    put({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 1}, {"tid", l},
         {"args", {{"sort_index", l}}}});
  }
  // A slice's event, as put() would write it (keys in nlohmann's order),
  // without building it: the bulk of the file.
  std::string text;
  auto put_slice = [&](int lane, const std::string& name, const std::string& kind,
                       int64_t start, int64_t end, bool failed, uint64_t seq,
                       const std::string& event) {
    if (!first)
      text += ",\n  ";
    first = false;
    text += "{\n   \"args\": {\n";
    if (!event.empty()) {
      text += "    \"event\": ";
      put_string(text, event);
      text += ",\n";
    }
    if (failed)
      text += "    \"failed\": true,\n";
    text += "    \"kind\": ";
    put_string(text, kind);
    text += ",\n    \"seq\": ";
    text += std::to_string(seq);
    text += "\n   },\n   \"cat\": ";
    put_string(text, kind);
    text += ",\n   \"dur\": ";
    put_double(text, static_cast<double>(end - start) / 1000.0);
    text += ",\n   \"name\": ";
    put_string(text, name);
    text += ",\n   \"ph\": \"X\",\n   \"pid\": 1,\n   \"tid\": ";
    text += std::to_string(lane);
    text += ",\n   \"ts\": ";
    put_double(text, us(start));
    text += "\n  }";
    if (text.size() > (1u << 16)) {
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      text.clear();
    }
  };
  static const std::string no_event;
  for (int d = 0; d < devices; ++d) {
    const auto& t = rec.traces[d];
    // The script's words for each record's item, where it has them.
    item_index items{rec.model[d], records[d].sorted() && rising(rec.model[d])};
    for (const auto& x : t.records) {
      auto kind = to_string(x.kind);
      const std::string* name = &x.description;
      std::string event_name;
      const std::string* event = &no_event;
      if (const auto* found = x.seq == 0 ? nullptr : items.find(x.seq)) {
        const auto& it = *found;
        if (kind != "cancel")
          name = &rec.description(it);
        event_name = rec.event(it);
        event = &event_name;
      }
      put_slice(d, *name, kind, x.start_ns, std::max(x.end_ns, x.start_ns), x.failed, x.seq,
                *event);
    }
    for (const auto& h : t.host)
      if (h.kind == host_span_kind::node_lost)
        put_slice(d, h.description, "lost", h.start_ns, std::max(h.end_ns, h.start_ns), true, 0,
                  no_event);
  }
  for (const auto& h : rec.host_slices)
    put_slice(h.lane, h.name, h.kind, h.start_ns, h.end_ns, h.failed, h.seq, h.event);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  auto inside = [](int64_t start, int64_t end, bool near_end) {
    auto dur = end - start;
    return near_end ? end - dur / 20 : start + dur / 20;
  };
  uint64_t id = 1;
  for (const auto& [a, b] : flows) {
    const auto& x = record_of(a);
    const auto& y = record_of(b);
    put({{"ph", "s"}, {"name", "wait"}, {"cat", "dependency"}, {"id", id}, {"pid", 1},
         {"tid", a.lane}, {"ts", us(inside(x.start_ns, std::max(x.end_ns, x.start_ns), true))}});
    put({{"ph", "f"}, {"bp", "e"}, {"name", "wait"}, {"cat", "dependency"}, {"id", id},
         {"pid", 1}, {"tid", b.lane},
         {"ts", us(inside(y.start_ns, std::max(y.end_ns, y.start_ns),
                          y.kind == trace_kind::gate))}});
    ++id;
  }
  out << "\n ]\n}\n";
}

} // namespace multidev::scenario
