// The timeline as a self-contained SVG Gantt chart: a lane per device and
// per host thread, slices coloured by kind, an arrow per wait, a time axis
// and a legend. No script, no external resource: any browser or image
// viewer shows it.
#include "multidev/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace multidev {

namespace {

constexpr double label_width = 250;
constexpr double plot_width = 1000;
constexpr double lane_height = 30;
constexpr double top = 40;
constexpr double right_margin = 30;

struct kind_style {
  const char* kind;
  const char* colour;
  const char* label;
};

constexpr kind_style styles[] = {
  {"task", "#4e79a7", "task"},       {"copy", "#59a14f", "copy"},
  {"memset", "#9c755f", "memset"},   {"pool", "#bab0ac", "pool release"},
  {"gate", "#f28e2b", "wait (will_wait_for)"}, {"cancel", "#ff9da7", "cancelled"},
  {"host", "#76b7b2", "host wait (sync, await; a script's steps)"},
  {"lost", "#e15759", "node lost (last heard to declared lost)"},
};

const char* colour_of(const std::string& kind) {
  for (const auto& s : styles)
    if (kind == s.kind)
      return s.colour;
  return "#999999";
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default:
        // Control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n')
          out += '?';
        else
          out += c;
    }
  }
  return out;
}

std::string duration_label(double ns) {
  if (ns == 0)
    return "0";
  if (ns < 1e3)
    return fmt::format("{:g} ns", ns);
  if (ns < 1e6)
    return fmt::format("{:g} µs", ns / 1e3);
  if (ns < 1e9)
    return fmt::format("{:g} ms", ns / 1e6);
  return fmt::format("{:g} s", ns / 1e9);
}

} // namespace

std::string timeline_svg(const timeline& tl) {
  double span = std::max<double>(1.0, static_cast<double>(tl.end_ns - tl.start_ns));
  auto x = [&](int64_t ns) {
    return label_width + plot_width * static_cast<double>(ns - tl.start_ns) / span;
  };
  auto y = [&](int lane) { return top + lane_height * lane; };
  double lanes_bottom = y(static_cast<int>(tl.lanes.size()));
  double height = lanes_bottom + 110;
  double width = label_width + plot_width + right_margin;
  std::string out;
  out += fmt::format(
    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
    "viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"12\">\n",
    width, height);
  out += "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
         "markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">"
         "<path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#333\"/></marker></defs>\n";
  out += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", width,
                     height);
  out += fmt::format("<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
                     escape(tl.title));
  // Lanes.
  for (std::size_t l = 0; l < tl.lanes.size(); ++l) {
    double ly = y(static_cast<int>(l));
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n",
                       label_width, ly, plot_width, lane_height,
                       l % 2 ? "#f4f4f4" : "#fafafa");
    out += fmt::format("<text x=\"10\" y=\"{}\">{}</text>\n", ly + lane_height / 2 + 4,
                       escape(tl.lanes[l]));
  }
  // Slices; neighbours of one kind closer than a pixel are drawn as one.
  std::vector<std::size_t> order(tl.slices.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) {
    const auto& sa = tl.slices[a];
    const auto& sb = tl.slices[b];
    return sa.lane != sb.lane ? sa.lane < sb.lane : sa.start_ns < sb.start_ns;
  });
  auto draw = [&](const timeline_slice& s, double x0, double x1, std::size_t merged) {
    double ly = y(s.lane) + 4;
    double w = std::max(1.0, x1 - x0);
    std::string title =
      merged > 1 ? fmt::format("{} {} items", merged, s.kind)
                 : fmt::format("{} ({}{}{}): {}{}", s.name, s.kind,
                               s.seq ? fmt::format(", seq {}", s.seq) : std::string{},
                               s.event.empty() ? std::string{} : ", event " + s.event,
                               duration_label(static_cast<double>(s.end_ns - s.start_ns)),
                               s.failed ? ", FAILED" : "");
    out += fmt::format("<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"{}>"
                       "<title>{}</title></rect>\n",
                       x0, ly, w, lane_height - 8, colour_of(s.kind),
                       s.failed ? " stroke=\"#d62728\" stroke-width=\"2.5\"" : "",
                       escape(title));
    std::string label = s.event.empty() ? s.name : s.event;
    if (merged == 1 && w > 7.0 * static_cast<double>(label.size()))
      out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" fill=\"white\" font-size=\"11\">{}</text>\n",
                         x0 + 3, ly + lane_height / 2 + 0, escape(label));
  };
  for (std::size_t k = 0; k < order.size();) {
    const auto& s = tl.slices[order[k]];
    double x0 = x(s.start_ns), x1 = x(s.end_ns);
    bool failed = s.failed;
    std::size_t n = 1, j = k + 1;
    for (; j < order.size(); ++j) {
      const auto& t = tl.slices[order[j]];
      if (t.lane != s.lane || t.kind != s.kind || t.failed || failed || x(t.start_ns) > x1 + 1.0
          || x1 - x0 >= 1.0)
        break;
      x1 = std::max(x1, x(t.end_ns));
      ++n;
    }
    draw(s, x0, x1, n);
    k = j;
  }
  // Arrows: from the awaited item's end to the waiting item.
  std::size_t drawn = 0;
  for (const auto& f : tl.flows) {
    if (++drawn > 5000)
      break;
    double y0 = y(f.from_lane) + lane_height / 2, y1 = y(f.to_lane) + lane_height / 2;
    y1 += y1 > y0 ? -lane_height / 2 + 4 : lane_height / 2 - 4;
    out += fmt::format("<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" "
                       "stroke=\"#333\" stroke-width=\"1\" marker-end=\"url(#arrow)\"/>\n",
                       x(f.from_ns), y0, x(f.to_ns), y1);
  }
  // The time axis: about ten ticks at 1, 2 or 5 times a power of ten.
  double raw = span / 10;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = raw / p < 2 ? 2 * p : raw / p < 5 ? 5 * p : 10 * p;
  out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n",
                     label_width, lanes_bottom + 2, label_width + plot_width, lanes_bottom + 2);
  for (double t = 0; t <= span + 1e-9; t += step) {
    double tx = label_width + plot_width * t / span;
    out += fmt::format("<line x1=\"{0:.2f}\" y1=\"{1}\" x2=\"{0:.2f}\" y2=\"{2}\" stroke=\"#333\"/>"
                       "<text x=\"{0:.2f}\" y=\"{3}\" text-anchor=\"middle\" font-size=\"10\">"
                       "{4}</text>\n",
                       tx, lanes_bottom + 2, lanes_bottom + 7, lanes_bottom + 19,
                       duration_label(t));
  }
  // Legend.
  double lx = 10, ly = lanes_bottom + 45;
  for (const auto& s : styles) {
    double need = 28 + 7.0 * std::string_view{s.label}.size();
    if (lx + need > width - right_margin) {
      lx = 10;
      ly += 22;
    }
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\"/>"
                       "<text x=\"{}\" y=\"{}\">{}</text>\n",
                       lx, ly, s.colour, lx + 18, ly + 11, s.label);
    lx += need;
  }
  if (lx + 360 > width - right_margin) {
    lx = 10;
    ly += 22;
  }
  out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#333\" "
                     "marker-end=\"url(#arrow)\"/><text x=\"{3}\" y=\"{4}\">dependency (the "
                     "awaited item's end to the wait)</text>\n",
                     lx, ly + 7, lx + 30, lx + 36, ly + 11);
  out += fmt::format("<text x=\"10\" y=\"{}\" font-size=\"10\" fill=\"#555\">red outline: "
                     "failed; hover a slice for its description, seq and duration</text>\n",
                     ly + 34);
  out += "</svg>\n";
  return out;
}

} // namespace multidev
