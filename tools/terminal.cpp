#include "terminal.hpp"

#include <algorithm>
#include <numeric>

namespace multidev::tools {

namespace {

/// Whether `x` is an atom or a list of atoms.
bool is_flat(const sexp& x) {
  if (x.is_atom())
    return true;
  const auto& items = x.items();
  return std::all_of(items.begin(), items.end(), [](const sexp& y) { return y.is_atom(); });
}

/// A list of atoms and flat lists: one record, kept on one line.
bool is_record(const sexp& x) {
  const auto& items = x.items();
  return std::all_of(items.begin(), items.end(), is_flat);
}

void print(const sexp& x, std::size_t depth, std::size_t indent, std::size_t width,
           std::string& out) {
  auto flat = x.to_string();
  if (x.is_atom() || indent + flat.size() <= width || (depth > 0 && is_record(x))) {
    out += flat;
    return;
  }
  // The head stays on the first line; each further item gets a line.
  const auto& items = x.items();
  out += '(';
  print(items[0], depth + 1, indent + 1, width, out);
  for (std::size_t i = 1; i < items.size(); ++i) {
    out += '\n';
    out.append(indent + 2, ' ');
    print(items[i], depth + 1, indent + 2, width, out);
  }
  out += ')';
}

std::string_view without_dashes(std::string_view s) {
  return s.substr(std::min(s.find_first_not_of('-'), s.size()));
}

} // namespace

std::string pretty_sexp(const sexp& x, std::size_t width) {
  std::string out;
  print(x, 0, 0, width, out);
  return out;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // d[i][j]: the distance between a's first i and b's first j characters,
  // three rows at a time.
  std::vector<std::size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  std::iota(prev.begin(), prev.end(), std::size_t{0});
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], before[j - 2] + 1);
    }
    before.swap(prev);
    prev.swap(cur);
  }
  return prev[b.size()];
}

std::optional<std::string> closest_name(std::string_view given,
                                        const std::vector<std::string>& known) {
  auto g = without_dashes(given);
  if (g.empty())
    return std::nullopt;
  std::size_t limit = g.size() <= 4 ? 1 : g.size() <= 8 ? 2 : 3;
  std::optional<std::string> best;
  std::size_t best_distance = limit + 1;
  for (const auto& name : known) {
    auto d = edit_distance(g, without_dashes(name));
    if (d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  return best;
}

} // namespace multidev::tools
