// Loading a scenario: s-expressions -> a checked, flat program. Every name
// is resolved and every loop and generator expanded here, so a script that
// loads runs without surprises from its own text.
#include "scenario/program.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <unordered_map>
#include <sstream>

namespace multidev::scenario {

std::string location::str() const {
  return fmt::format("{}:{}:{}", file, line, column);
}

namespace {

/// The message with bytes that are not printable ASCII written as `\xNN`,
/// so that a binary script gets a readable one-line error.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

} // namespace

script_error::script_error(location where, const std::string& message)
  : std::runtime_error(where.str() + ": " + printable(message)),
    where_(std::move(where)),
    message_(printable(message)) {
}

namespace {

/// Loops may not expand a script past this many steps (each step is a few
/// hundred bytes until the run; 2 M of them load in a few seconds). The fuzz
/// build (fuzz/) lowers it, so that an input at the limit stays fast.
#ifndef MULTIDEV_SCENARIO_MAX_STEPS
#define MULTIDEV_SCENARIO_MAX_STEPS 2'000'000
#endif
constexpr std::size_t max_steps = MULTIDEV_SCENARIO_MAX_STEPS;

/// Forms and loop iterations a script may expand to in all: loops of loops
/// that make no steps (empty, or only declarations) are bounded too.
constexpr std::size_t max_expansion = 4 * max_steps;

/// The longest `(matches RE)`: std::regex compiles a pattern recursively,
/// about a frame per character, so a long one overflows the stack.
constexpr std::size_t max_regex = 1000;

enum class sym { tnode, context, event, host, hold, dag, node, round };

const char* sym_name(sym s) {
  switch (s) {
    case sym::tnode: return "a tnode";
    case sym::context: return "a context";
    case sym::event: return "an event";
    case sym::host: return "a host buffer";
    case sym::hold: return "a hold";
    case sym::dag: return "a random-dag";
    case sym::node: return "a node";
    case sym::round: return "a round";
  }
  return "a name";
}

struct symbol {
  sym kind;
  int id;
  location where;
};

/// A form `(head positional... (option value...)...)`: its positional
/// arguments and its options, split by the option names the form knows.
struct form {
  const sexp* whole;
  std::string head;
  std::vector<const sexp*> pos;
  std::map<std::string, const sexp*> opts;
};

class loader {
public:
  loader(std::string file, std::optional<uint64_t> seed,
         const std::map<std::string, std::string>& params)
    : params_(params), seed_override_(seed) {
    file_ = file;
    prog_.file = std::move(file);
    prog_.seed = seed.value_or(1);
  }

  std::shared_ptr<const program> load(std::string_view text) {
    std::vector<sexp> forms;
    try {
      forms = parse_sexps(text);
    } catch (const sexp_parse_error& e) {
      throw script_error(location{prog_.file, e.line(), e.column()}, e.message());
    }
    if (forms.empty())
      throw script_error(location{prog_.file, 1, 1},
                         "the script is empty; it needs at least a (devices N) form");
    {
      std::error_code ec;
      auto key = std::filesystem::weakly_canonical(file_, ec).string();
      including_.emplace_back(ec ? file_ : key, file_);
    }
    for (const auto& f : forms)
      statement(f, prog_.steps);
    // The (sync-in ...) events named before the step that makes them.
    for (const auto& fw : forward_events_) {
      auto it = find_name(fw.name);
      if (!it)
        throw script_error(fw.where, fmt::format("sync-in: unknown event '{}': no step of "
                                                     "the script makes it",
                                                     fw.name));
      if (it->kind != sym::event)
        throw script_error(fw.where,
                           fmt::format("sync-in: '{}' is {} (declared at {}:{}), expected an event",
                                       fw.name, sym_name(it->kind), it->where.line,
                                       it->where.column));
      (*fw.steps)[fw.index].ev = it->id;
    }
    for (const auto& [device, faults] : pending_faults_)
      for (const auto& [step_no, fault] : faults)
        throw script_error(fault.second,
                           fmt::format("fail-at: device {} runs only {} kernel(s), never a "
                                       "kernel number {}",
                                       device, kernels_on_[device], step_no));
    resolve_aimed_faults();
    for (const auto& [name, value] : params_)
      if (!param_names_.count(name))
        throw script_error(location{prog_.file, 0, 0},
                           fmt::format("--param {}={}: the script has no (param {} ...)", name,
                                       value, name));
    if (prog_.devices == 0)
      throw script_error(at(forms.front()), "the script never declares its devices: add "
                                            "(devices N) before anything else");
    // Inner loops were closed first: outer blocks go before the blocks
    // they hold.
    std::stable_sort(prog_.repeats.begin(), prog_.repeats.end(),
                     [](const repeat_block& a, const repeat_block& b) {
                       return a.first != b.first ? a.first < b.first : a.count > b.count;
                     });
    prog_.steps_run = total_steps_;
    return std::make_shared<const program>(std::move(prog_));
  }

private:
  /// A fault aimed at an event by name, resolved at the end of the load.
  struct aimed_fault {
    std::string head; // fail-at, delay-at, cancel-at, kill-node-at, cut-node-at
    std::string name;
    location name_at;
    location where;
    std::string text;
    std::string message;
    double ms = 0;
    int node = -1; // kill-node-at, cut-node-at: the node given, if any
  };

  // -- positions and errors ----------------------------------------------------

  location at(const sexp& s) const {
    return location{file_, s.line, s.column};
  }

  [[noreturn]] void fail(const sexp& s, const std::string& msg) const {
    throw script_error(at(s), msg);
  }

  // -- reading values ----------------------------------------------------------

  /// The atom's text with loop variables (`$i`) substituted. In a name an
  /// unknown `$x` is an error; in a string (`strict` false: messages,
  /// regular expressions, kernel strings) it stays as written.
  std::string text(const sexp& s, const char* what, bool strict = true) const {
    if (!s.is_atom())
      fail(s, fmt::format("expected {}, got a list {}", what, s.to_string()));
    const auto& a = s.as_atom();
    if (a.find('$') == std::string::npos)
      return a;
    std::string out;
    for (std::size_t i = 0; i < a.size();) {
      if (a[i] != '$') {
        out += a[i++];
        continue;
      }
      if (i + 1 < a.size() && a[i + 1] == '{') {
        // ${EXPR}: a whole-number expression of loop variables and params.
        auto close = a.find('}', i + 2);
        if (close == std::string::npos) {
          if (strict)
            fail(s, fmt::format("unclosed '${{' in '{}': write ${{EXPR}}, e.g. mark${{d+1}}", a));
          out += a.substr(i);
          break;
        }
        auto expr = a.substr(i + 2, close - i - 2);
        std::string why;
        if (auto v = evaluate(expr, why)) {
          out += std::to_string(*v);
        } else {
          if (strict)
            fail(s, fmt::format("in '${{{}}}' of '{}': {}", expr, a, why));
          out += a.substr(i, close + 1 - i);
        }
        i = close + 1;
        continue;
      }
      std::size_t j = i + 1;
      while (j < a.size() && (std::isalnum(static_cast<unsigned char>(a[j])) || a[j] == '_'))
        ++j;
      auto var = a.substr(i + 1, j - i - 1);
      auto it = vars_.find(var);
      if (var.empty() || it == vars_.end()) {
        if (strict)
          fail(s, fmt::format("unknown loop variable '${}' in '{}'", var, a));
        out += a.substr(i, j - i);
        i = j;
        continue;
      }
      out += std::to_string(it->second);
      i = j;
    }
    return out;
  }

  /// `EXPR` of `${EXPR}`: whole numbers and variables (loop variables and
  /// params, with or without `$`) joined by `+ - * / %` (`*`, `/` and `%`
  /// first, then left to right; `/` rounds toward zero, `%` takes the sign
  /// of the divisor as `mod` does), a leading `-` on a number. Nothing on an
  /// error, with `why` set.
  std::optional<int64_t> evaluate(const std::string& e, std::string& why) const {
    std::size_t i = 0;
    auto operand = [&]() -> std::optional<int64_t> {
      bool neg = i < e.size() && e[i] == '-';
      if (neg)
        ++i;
      if (i < e.size() && e[i] == '$')
        ++i;
      auto b = i;
      while (i < e.size() && (std::isalnum(static_cast<unsigned char>(e[i])) || e[i] == '_'))
        ++i;
      auto t = e.substr(b, i - b);
      if (t.empty()) {
        why = i < e.size() ? fmt::format("expected a number or a variable at '{}'", e.substr(i))
                           : "expected a number or a variable at the end";
        return std::nullopt;
      }
      int64_t v = 0;
      if (std::isdigit(static_cast<unsigned char>(t[0]))) {
        auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (ec != std::errc{} || end != t.data() + t.size()) {
          why = fmt::format("'{}' is not a whole number", t);
          return std::nullopt;
        }
      } else if (auto it = vars_.find(t); it != vars_.end()) {
        v = it->second;
      } else {
        why = fmt::format("unknown variable '{}' (a loop variable or a param)", t);
        return std::nullopt;
      }
      if (neg && __builtin_sub_overflow(int64_t{0}, v, &v)) {
        why = "the result is outside the 64-bit range";
        return std::nullopt;
      }
      return v;
    };
    auto apply = [&](char op, int64_t x, int64_t y) -> std::optional<int64_t> {
      int64_t r = 0;
      bool over = false;
      switch (op) {
        case '+': over = __builtin_add_overflow(x, y, &r); break;
        case '-': over = __builtin_sub_overflow(x, y, &r); break;
        case '*': over = __builtin_mul_overflow(x, y, &r); break;
        default:
          if (y == 0) {
            why = "division by zero";
            return std::nullopt;
          }
          if (x == INT64_MIN && y == -1) {
            over = true;
            break;
          }
          r = op == '/' ? x / y : x % y;
          if (op == '%' && r != 0 && (r < 0) != (y < 0))
            r += y; // the sign of the divisor, as (mod a b)
      }
      if (over) {
        why = "the result is outside the 64-bit range";
        return std::nullopt;
      }
      return r;
    };
    auto term = [&]() -> std::optional<int64_t> {
      auto v = operand();
      while (v && i < e.size() && (e[i] == '*' || e[i] == '/' || e[i] == '%')) {
        char op = e[i++];
        auto w = operand();
        if (!w)
          return std::nullopt;
        v = apply(op, *v, *w);
      }
      return v;
    };
    auto v = term();
    while (v && i < e.size() && (e[i] == '+' || e[i] == '-')) {
      char op = e[i++];
      auto w = term();
      if (!w)
        return std::nullopt;
      v = apply(op, *v, *w);
    }
    if (v && i < e.size()) {
      why = fmt::format("unexpected '{}'", e.substr(i));
      return std::nullopt;
    }
    return v;
  }

  /// A whole number: a literal, a loop variable, or `(+ a b ...)`, `(- a
  /// b)`, `(* a b ...)`, `(mod a b)`, `(/ a b)`.
  int64_t integer(const sexp& s, const char* what) const {
    if (s.is_list()) {
      const auto& xs = s.items();
      if (xs.empty() || !xs[0].is_atom())
        fail(s, fmt::format("{} must be a whole number or (+ a b ...), got {}", what,
                            s.to_string()));
      auto o = xs[0].as_atom();
      if (o != "+" && o != "-" && o != "*" && o != "mod" && o != "/")
        fail(xs[0], fmt::format("unknown arithmetic '{}' in {}; use +, -, *, / or mod", o,
                                what));
      if (xs.size() < 3)
        fail(s, fmt::format("({} ...) needs at least two operands", o));
      int64_t v = integer(xs[1], what);
      for (std::size_t i = 2; i < xs.size(); ++i) {
        int64_t w = integer(xs[i], what);
        bool overflow = false;
        if (o == "+")
          overflow = __builtin_add_overflow(v, w, &v);
        else if (o == "-")
          overflow = __builtin_sub_overflow(v, w, &v);
        else if (o == "*")
          overflow = __builtin_mul_overflow(v, w, &v);
        else if (w == 0)
          fail(xs[i], fmt::format("({} ...) by zero", o));
        else if (o == "/" && v == INT64_MIN && w == -1)
          overflow = true;
        else if (o == "/")
          v /= w;
        else {
          // The remainder with the sign of w (w == -1: INT64_MIN % -1 traps).
          int64_t r = w == -1 ? 0 : v % w;
          v = r != 0 && (r < 0) != (w < 0) ? r + w : r;
        }
        if (overflow)
          fail(s, fmt::format("({} ...) overflows a 64-bit integer in {}", o, what));
      }
      return v;
    }
    auto t = text(s, what);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc{} || end != t.data() + t.size())
      fail(s, fmt::format("{} must be a whole number, got '{}'", what, t));
    return v;
  }

  int64_t integer_in(const sexp& s, const char* what, int64_t lo, int64_t hi) const {
    auto v = integer(s, what);
    if (v < lo || v > hi)
      fail(s, fmt::format("{} must be between {} and {}, got {}", what, lo, hi, v));
    return v;
  }

  double real(const sexp& s, const char* what) const {
    if (s.is_list())
      return static_cast<double>(integer(s, what));
    auto t = text(s, what);
    double v = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc{} || end != t.data() + t.size() || !std::isfinite(v))
      fail(s, fmt::format("{} must be a number, got '{}'", what, t));
    return v;
  }

  int device(const sexp& s) const {
    if (prog_.devices == 0)
      fail(s, "a device is used before (devices N) declares them");
    // NODE/K: the K-th device of a node.
    if (s.is_atom()) {
      auto t = text(s, "a device");
      if (auto slash = t.find('/'); slash != std::string::npos && !looks_numeric(t)) {
        auto name = t.substr(0, slash);
        auto it = std::find_if(prog_.nodes.begin(), prog_.nodes.end(),
                               [&](const auto& n) { return n.name == name; });
        if (it == prog_.nodes.end())
          fail(s, fmt::format("unknown node '{}' in '{}'", name, t));
        int64_t k = 0;
        auto rest = t.substr(slash + 1);
        auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), k);
        if (ec != std::errc{} || end != rest.data() + rest.size() || k < 0 || k >= it->devices)
          fail(s, fmt::format("'{}': node {} has {} device(s), {}/0 to {}/{}", t, name,
                              it->devices, name, name, it->devices - 1));
        return it->first + static_cast<int>(k);
      }
    }
    auto v = integer(s, "a device ordinal");
    if (v < 0 || v >= prog_.devices)
      fail(s, fmt::format("device {} does not exist: the scenario has {} device(s), "
                          "ordinals 0 to {}",
                          v, prog_.devices, prog_.devices - 1));
    return static_cast<int>(v);
  }

  /// Refuses `what` on a device of a node: it needs a closure on the
  /// device's runner, which does not travel (named kernels, transfers,
  /// waits, pools do).
  void local_only(const sexp& at_, int d, const char* what) const {
    if (d < prog_.local_devices)
      return;
    fail(at_, on_a_node(d, what));
  }

  /// Why `what` is refused on device `d`, a device of a node.
  std::string on_a_node(int d, const char* what) const {
    const auto& n = *std::find_if(prog_.nodes.begin(), prog_.nodes.end(), [&](const auto& x) {
      return d >= x.first && d < x.first + x.devices;
    });
    return fmt::format("{} needs a closure on the device's runner, which does not travel: "
                       "device {} is {}/{} on node {} (named kernels, checksums, transfers, "
                       "waits, pools, memsets, delay and sync-in work there)",
                       what, d, n.name, d - n.first, n.name);
  }

  /// `b/0 (device 3)`: a node's device as the script names it.
  std::string node_device_name(int d) const {
    const auto& n = *std::find_if(prog_.nodes.begin(), prog_.nodes.end(), [&](const auto& x) {
      return d >= x.first && d < x.first + x.devices;
    });
    return fmt::format("{}/{} (device {})", n.name, d - n.first, d);
  }

  static bool looks_numeric(const std::string& t) {
    return !t.empty() && (std::isdigit(static_cast<unsigned char>(t[0])) || t[0] == '-'
                          || t[0] == '+' || t[0] == '.');
  }

  /// A name being declared: not a number, not taken.
  std::string new_name(const sexp& s, sym kind) {
    auto n = text(s, "a name");
    if (n.empty() || looks_numeric(n))
      fail(s, fmt::format("'{}' cannot name {}: names start with a letter", n, sym_name(kind)));
    if (auto it = find_name(n))
      fail(s, fmt::format("duplicate name '{}': already {} declared at {}:{}", n,
                          sym_name(it->kind), it->where.line, it->where.column));
    return n;
  }

  void declare(const std::string& n, const sexp& s, sym kind, int id) {
    names_.emplace(n, symbol{kind, id, at(s)});
  }

  /// A declared name, or one of a family's (`name_pattern`).
  std::optional<symbol> find_name(const std::string& n) const {
    if (auto it = names_.find(n); it != names_.end())
      return it->second;
    if (patterns_.empty())
      return std::nullopt;
    // A pattern's number is a whole run of digits of the name: look the
    // name up by each run.
    for (auto [b, e] : digit_runs(n)) {
      auto it = pattern_keys_.find(pattern_key(n.substr(0, b), n.substr(e)));
      if (it == pattern_keys_.end())
        continue;
      const auto& p = patterns_[it->second];
      if (auto id = p.match(n))
        return symbol{sym::event, *id, p.where};
    }
    return std::nullopt;
  }

  /// The runs of digits in `s`, as [begin, end) pairs.
  static std::vector<std::pair<std::size_t, std::size_t>> digit_runs(const std::string& s) {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (std::size_t i = 0; i < s.size();) {
      if (!std::isdigit(static_cast<unsigned char>(s[i]))) {
        ++i;
        continue;
      }
      auto b = i;
      while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])))
        ++i;
      out.emplace_back(b, i);
    }
    return out;
  }

  static std::string pattern_key(const std::string& prefix, const std::string& suffix) {
    return prefix + '\0' + suffix;
  }

  /// The key with every run of digits written `#`, and the index of the
  /// pattern's own number among the runs.
  static std::pair<std::string, std::size_t> pattern_shape(const std::string& prefix,
                                                          const std::string& suffix) {
    auto hash = [](const std::string& s) {
      std::string out;
      for (std::size_t i = 0; i < s.size(); ++i)
        if (!std::isdigit(static_cast<unsigned char>(s[i])))
          out += s[i];
        else if (out.empty() || out.back() != '#' || i == 0
                 || !std::isdigit(static_cast<unsigned char>(s[i - 1])))
          out += '#';
      return out;
    };
    return {hash(prefix) + "#" + hash(suffix), digit_runs(prefix).size()};
  }

  symbol lookup(const sexp& s, sym kind) const {
    auto n = text(s, sym_name(kind));
    auto it = find_name(n);
    if (!it)
      fail(s, fmt::format("unknown {} '{}'", std::string{sym_name(kind)}.substr(
                                               std::string_view{sym_name(kind)}.find(' ') + 1),
                          n));
    if (it->kind != kind)
      fail(s, fmt::format("'{}' is {} (declared at {}:{}), expected {}", n,
                          sym_name(it->kind), it->where.line,
                          it->where.column, sym_name(kind)));
    return *it;
  }

  int event(const sexp& s) const {
    return lookup(s, sym::event).id;
  }

  /// A context: a context name, or a device (an ordinal, or `NODE/K` that
  /// is no declared name) for a fresh context.
  void ctx(const sexp& s, step& st) const {
    if (s.is_atom()) {
      auto t = text(s, "a context");
      if (looks_numeric(t) || (t.find('/') != std::string::npos && !find_name(t))) {
        st.device = device(s);
        st.ctx = -1;
        return;
      }
    }
    if (s.is_list()) {
      st.device = device(s);
      return;
    }
    st.ctx = lookup(s, sym::context).id;
    st.device = ctx_device_[st.ctx];
  }

  /// A tnode that must be in the context of `st`.
  int node_in(const sexp& s, const step& st) const {
    int t = lookup(s, sym::tnode).id;
    if (st.ctx < 0)
      fail(s, fmt::format("tnode '{}' needs a context that holds it; device {} given as a number "
                          "is a fresh context with no buffers: declare (context NAME {}) and "
                          "give it '{}' first",
                          prog_.tnodes[t].label, st.device, st.device, prog_.tnodes[t].label));
    if (st.ctx < 0 || !ctx_nodes_[st.ctx].count(t))
      fail(s, fmt::format("tnode '{}' is not in {}: give it a buffer there first with "
                          "(alloc CTX {}), (from-host CTX {} ...) or (copy {} ...)",
                          prog_.tnodes[t].label,
                          st.ctx < 0 ? fmt::format("the fresh context of device {}", st.device)
                                     : fmt::format("context '{}'", prog_.contexts[st.ctx]),
                          prog_.tnodes[t].label, prog_.tnodes[t].label,
                          prog_.tnodes[t].label));
    return t;
  }

  int bind_event(const sexp& s) {
    auto n = new_name(s, sym::event);
    int id = prog_.event_ids++;
    prog_.events.push_back(event_decl{n, at(s), false, in_round_});
    declare(n, s, sym::event, id);
    return id;
  }

  // -- forms -------------------------------------------------------------------

  /// Splits `s` into positional arguments (between `min` and `max`) and
  /// the options named in `known`.
  form split(const sexp& s, std::size_t min, std::size_t max,
             std::initializer_list<const char*> known, const char* usage,
             bool takes_forms = false) const {
    form f{&s, s.items()[0].as_atom(), {}, {}};
    const auto& xs = s.items();
    for (std::size_t i = 1; i < xs.size(); ++i) {
      const auto& x = xs[i];
      if (x.is_list() && !x.items().empty() && x.items()[0].is_atom()) {
        const auto& h = x.items()[0].as_atom();
        bool is_opt = std::any_of(known.begin(), known.end(),
                                  [&](const char* k) { return h == k; });
        if (is_opt) {
          if (f.opts.count(h))
            fail(x, fmt::format("({} ...) is given twice in this ({} ...) form", h, f.head));
          f.opts[h] = &x;
          continue;
        }
        bool arithmetic = h == "+" || h == "-" || h == "*" || h == "/" || h == "mod"
                          || h == "fill" || h == "iota" || h == "values";
        if (!arithmetic && !takes_forms && f.pos.size() >= min) {
          std::string ks;
          for (auto k : known)
            ks += fmt::format("{}({} ...)", ks.empty() ? "" : ", ", k);
          fail(x, fmt::format("unknown option ({} ...) in ({} ...); {}", h, f.head,
                              known.size() ? "it takes " + ks : "it takes no options"));
        }
      }
      f.pos.push_back(&x);
    }
    if (f.pos.size() < min || f.pos.size() > max)
      fail(s, fmt::format("({} ...) takes {} argument{}{}: {}", f.head,
                          min == max ? std::to_string(min)
                          : max == SIZE_MAX ? fmt::format("at least {}", min)
                                            : fmt::format("{} to {}", min, max),
                          max == 1 && min == 1 ? "" : "s", "", usage));
    return f;
  }

  /// The single value of option `(key value)`.
  const sexp& opt_value(const form& f, const char* key) const {
    const auto& o = *f.opts.at(key);
    if (o.items().size() != 2)
      fail(o, fmt::format("({} ...) takes exactly one value", key));
    return o.items()[1];
  }

  int opt_event(const form& f) {
    if (!f.opts.count("as"))
      return -1;
    return bind_event(opt_value(f, "as"));
  }

  void push(std::vector<step>& out, step&& st) {
    if (++total_steps_ > max_steps)
      fail(*current_, fmt::format("the script expands to more than the limit of {} steps",
                                  max_steps));
    if (st.device >= 0 && counts_item(st.kind)) {
      // A round's items run when it is replayed: counted per replay.
      auto& items = in_round_ >= 0 ? round_items_ : prog_.items;
      items[st.device] += st.kind == op::copy ? 2 : 1;
    }
    st.round = in_round_;
    out.push_back(std::move(st));
  }

  static bool counts_item(op k) {
    switch (k) {
      case op::free_pool: case op::memset: case op::kernel: case op::wait: case op::from_host:
      case op::to_host: case op::copy: case op::delay: case op::hold: case op::sync_in:
        return true;
      default:
        return false;
    }
  }

  step make(const sexp& s, op k) const {
    step st;
    st.kind = k;
    st.where = at(s);
    st.text = substituted(s);
    return st;
  }

  std::string substituted(const sexp& s) const {
    if (vars_.empty())
      return s.to_string();
    if (s.is_atom()) {
      try {
        return sexp::atom(text(s, "")).to_string();
      } catch (const script_error&) {
        return s.to_string();
      }
    }
    std::string out = "(";
    for (const auto& x : s.items())
      out += (out.size() > 1 ? " " : "") + substituted(x);
    return out + ")";
  }

  /// Counts a form or a loop iteration against `max_expansion`.
  void expand(const sexp& s) {
    if (++expanded_ > max_expansion)
      fail(s, fmt::format("the script expands to more than the limit of {} forms and loop "
                          "iterations",
                          max_expansion));
  }

  void statement(const sexp& s, std::vector<step>& out) {
    current_ = &s;
    expand(s);
    if (s.is_atom())
      fail(s, fmt::format("expected a form like (devices 2), got the atom '{}'", s.as_atom()));
    if (s.items().empty())
      fail(s, "empty form ()");
    if (!s.items()[0].is_atom())
      fail(s.items()[0], "a form starts with its name, e.g. (kernel ...), not a list");
    const auto& head = s.items()[0].as_atom();
    if (head != "devices" && head != "scenario" && head != "seed" && head != "tnode"
        && head != "include" && head != "param" && prog_.devices == 0)
      fail(s, fmt::format("({} ...) before (devices N): declare the devices first", head));
    if (in_round_ >= 0)
      recordable(s, head);
    if (head == "scenario")
      return scenario_form(s);
    if (head == "include")
      return include_form(s, out);
    if (head == "param")
      return param_form(s);
    if (head == "devices")
      return devices_form(s);
    if (head == "seed")
      return seed_form(s);
    if (head == "tnode")
      return tnode_form(s);
    if (head == "context")
      return context_form(s, out);
    if (head == "child")
      return child_form(s, out);
    if (head == "alloc")
      return alloc_form(s, out);
    if (head == "pool")
      return pool_form(s, out);
    if (head == "free-pool")
      return free_pool_form(s, out);
    if (head == "memset")
      return memset_form(s, out);
    if (head == "kernel")
      return kernel_form(s, out);
    if (head == "checksum")
      return checksum_form(s, out);
    if (head == "wait")
      return wait_form(s, out);
    if (head == "all-work")
      return all_work_form(s, out);
    if (head == "sync")
      return event_form(s, out, op::sync);
    if (head == "await" || head == "sync-device" || head == "cancel" || head == "recover")
      return device_form(s, out);
    if (head == "from-host")
      return from_host_form(s, out);
    if (head == "to-host")
      return to_host_form(s, out);
    if (head == "copy")
      return copy_form(s, out);
    if (head == "kill")
      return kill_form(s, out);
    if (head == "delay")
      return delay_form(s, out);
    if (head == "hold")
      return hold_form(s, out);
    if (head == "sync-in")
      return sync_in_form(s, out);
    if (head == "release")
      return release_form(s, out);
    if (head == "await-hold")
      return await_hold_form(s, out);
    if (head == "sleep")
      return sleep_form(s, out);
    if (head == "fail-at")
      return fail_at_form(s);
    if (head == "delay-at" || head == "cancel-at" || head == "kill-node-at"
        || head == "cut-node-at")
      return aimed_fault_form(s);
    if (head == "nodes")
      return nodes_form(s);
    if (head == "kill-node" || head == "cut-node" || head == "detach" || head == "attach")
      return kill_node_form(s, out);
    if (head == "repeat")
      return repeat_form(s, out);
    if (head == "random-dag")
      return random_dag_form(s, out);
    if (head == "expect")
      return expect_form(s, out);
    if (head == "round")
      return round_form(s, out);
    if (head == "replay")
      return replay_form(s, out);
    fail(s.items()[0], fmt::format("unknown form '{}' (docs/scenarios.md lists the forms)", head));
  }

  /// Refuses, inside `(round NAME ...)`, a form that cannot be one of its
  /// items: it acts on the host now, or declares, or decides something a
  /// replay could not do again.
  void recordable(const sexp& s, const std::string& head) const {
    static const std::set<std::string> items{"kernel", "checksum", "delay", "memset", "copy",
                                             "wait", "repeat"};
    if (items.count(head))
      return;
    const auto& r = prog_.rounds[static_cast<std::size_t>(in_round_)];
    std::string why =
      head == "round" || head == "replay"
        ? "rounds do not nest; record it before or after, and replay it outside"
      : head == "sync" || head == "await" || head == "sync-device" || head == "sync-in"
          || head == "await-hold" || head == "sleep"
        ? "it waits on the host now; wait after (replay ...)"
      : head == "from-host" || head == "to-host"
        ? "it copies host memory now; copy before the round, or read the results after "
          "(replay ...)"
      : head == "expect" ? "expectations look at what ran; expect after (replay ...)"
      : head == "alloc" || head == "pool" || head == "free-pool" || head == "context"
          || head == "child" || head == "tnode"
        ? "it allocates or declares now; do it before the round"
      : head == "fail-at" || head == "delay-at" || head == "cancel-at" || head == "kill-node-at"
          || head == "cut-node-at"
        ? "faults cannot be aimed inside a round"
        : "it is no item a replay can schedule again";
    fail(s, fmt::format("({} ...) cannot be recorded in round '{}' (at {}:{}): {}; a round "
                        "records kernel, checksum, delay, memset, copy and wait forms (and "
                        "repeat of them)",
                        head, r.name, r.where.line, r.where.column, why));
  }

  /// `(round NAME FORM...)`: the forms become the round's items, recorded
  /// when the step runs (`runner.cpp`, `record_round`).
  void round_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, SIZE_MAX, {}, "(round NAME FORM...)", true);
    const auto& name_at = *f.pos[0];
    auto n = new_name(name_at, sym::round);
    if (f.pos.size() < 2)
      fail(s, fmt::format("round '{}' has no forms: give it the kernels, copies, waits... "
                          "it replays",
                          n));
    int idx = static_cast<int>(prog_.rounds.size());
    prog_.rounds.push_back(round_decl{n, at(s), {}, {}});
    declare(n, name_at, sym::round, idx);
    round_items_.assign(static_cast<std::size_t>(prog_.devices), 0);
    in_round_ = idx;
    std::vector<step> body;
    for (std::size_t k = 1; k < f.pos.size(); ++k)
      statement(*f.pos[k], body);
    in_round_ = -1;
    current_ = &s;
    if (body.empty())
      fail(s, fmt::format("round '{}' records no items: its forms expanded to none (a (repeat "
                          "0 ...)?)",
                          n));
    auto& r = prog_.rounds[static_cast<std::size_t>(idx)];
    r.body = std::move(body);
    r.items = round_items_;
    auto st = make(s, op::round);
    st.host = idx;
    push(out, std::move(st));
  }

  /// `(replay NAME N)`: the round replayed N times, one after the other.
  void replay_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, 2, {}, "(replay ROUND N)");
    auto st = make(s, op::replay);
    st.host = lookup(*f.pos[0], sym::round).id;
    st.times = static_cast<uint64_t>(
      integer_in(*f.pos[1], "the number of replays", 1, int64_t{max_steps}));
    const auto& r = prog_.rounds[static_cast<std::size_t>(st.host)];
    for (std::size_t d = 0; d < r.items.size(); ++d)
      prog_.items[d] += r.items[d] * st.times;
    push(out, std::move(st));
  }

  /// `(include "FILE")`: FILE's forms, read relative to the including
  /// file's directory, in place of the form. Errors in them name FILE's
  /// line and column and, after the message, where it was included.
  void include_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, 1, {}, "(include \"FILE\")");
    auto name = text(*f.pos[0], "a file name", false);
    namespace fs = std::filesystem;
    auto path = (fs::path{file_}.parent_path() / name).lexically_normal();
    std::error_code ec;
    auto key = fs::weakly_canonical(path, ec).string();
    if (ec)
      key = path.string();
    if (auto it = std::find_if(including_.begin(), including_.end(),
                               [&](const auto& x) { return x.first == key; });
        it != including_.end()) {
      std::string chain;
      for (auto i = it; i != including_.end(); ++i)
        chain += i->second + " includes ";
      fail(*f.pos[0], fmt::format("include cycle: {}{} again", chain, path.string()));
    }
    auto parsed = included_.find(key);
    if (parsed == included_.end()) {
      // Only a regular file: a device or a pipe (/dev/zero, a FIFO) could
      // block or never end.
      std::ifstream in;
      if (fs::is_regular_file(path, ec))
        in.open(path, std::ios::binary);
      if (!in.is_open() || !in)
        fail(*f.pos[0], fmt::format("cannot read the included file '{}'{}", path.string(),
                                    fs::exists(path, ec) && !fs::is_regular_file(path, ec)
                                      ? ": not a regular file"
                                      : ""));
      // At most max_include_bytes: a regular file need not be small
      // (/proc/kcore is one, terabytes long).
      constexpr std::size_t max_include_bytes = std::size_t{64} << 20;
      std::string text;
      char chunk[1 << 16];
      while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
        text.append(chunk, static_cast<std::size_t>(in.gcount()));
        if (text.size() > max_include_bytes)
          fail(*f.pos[0], fmt::format("the included file '{}' is larger than {} MiB",
                                      path.string(), max_include_bytes >> 20));
      }
      std::vector<sexp> forms;
      try {
        forms = parse_sexps(text);
      } catch (const sexp_parse_error& e) {
        throw script_error(location{path.string(), e.line(), e.column()},
                           fmt::format("{} (in the file included at {})", e.message(),
                                       at(s).str()));
      }
      parsed = included_.emplace(key, std::move(forms)).first;
    }
    auto outer = file_;
    auto where = at(s);
    including_.emplace_back(key, path.string());
    file_ = path.string();
    try {
      for (const auto& x : parsed->second)
        statement(x, out);
    } catch (const script_error& e) {
      file_ = outer;
      including_.pop_back();
      throw script_error(e.where(), fmt::format("{} (in the file included at {})", e.message(),
                                                where.str()));
    }
    file_ = outer;
    including_.pop_back();
    current_ = &s;
  }

  /// `(param NAME DEFAULT)`: `$NAME` is `--param NAME=VALUE`'s whole
  /// number, else DEFAULT, from here to the end of the script.
  void param_form(const sexp& s) {
    auto f = split(s, 2, 2, {}, "(param NAME DEFAULT)");
    auto name = text(*f.pos[0], "a parameter name");
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
        }))
      fail(*f.pos[0], fmt::format("'{}' cannot name a parameter (letters, digits, _)", name));
    if (param_names_.count(name))
      fail(*f.pos[0], fmt::format("parameter '{}' is declared twice", name));
    if (vars_.count(name))
      fail(*f.pos[0], fmt::format("'${}' is already a loop variable here: declare (param {} "
                                  "...) outside the repeat",
                                  name, name));
    if (vars_.size() > param_names_.size())
      fail(s, "(param ...) must be outside every repeat (it holds for the rest of the script)");
    int64_t v = 0;
    if (auto it = params_.find(name); it != params_.end()) {
      const auto& t = it->second;
      auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
      if (t.empty() || ec != std::errc{} || end != t.data() + t.size())
        fail(s, fmt::format("--param {}={}: the value must be a whole number", name, t));
    } else {
      v = integer(*f.pos[1], "the default of a parameter");
    }
    param_names_.insert(name);
    vars_[name] = v;
  }

  void scenario_form(const sexp& s) {
    auto f = split(s, 1, 1, {}, "(scenario NAME)");
    if (!prog_.name.empty())
      fail(s, "(scenario ...) is given twice");
    prog_.name = text(*f.pos[0], "the scenario's name");
  }

  void devices_form(const sexp& s) {
    auto f = split(s, 1, 1, {"backend", "queue-capacity"},
                   "(devices N [(backend cpu|fake)] [(queue-capacity N)])");
    if (prog_.devices != 0)
      fail(s, "(devices ...) is given twice");
    prog_.devices = static_cast<int>(integer_in(*f.pos[0], "the number of devices", 1, 256));
    prog_.local_devices = prog_.devices;
    if (f.opts.count("backend")) {
      const auto& b = opt_value(f, "backend");
      auto name = text(b, "a backend");
      if (name != "cpu" && name != "fake")
        fail(b, fmt::format("unknown backend '{}'; scenarios run on cpu or fake", name));
      prog_.backend = name;
    }
    if (f.opts.count("queue-capacity"))
      prog_.queue_capacity = static_cast<std::size_t>(
        integer_in(opt_value(f, "queue-capacity"), "the queue capacity", 1, int64_t{1} << 32));
    prog_.items.assign(prog_.devices, 0);
    kernels_on_.assign(prog_.devices, 0);
  }

  void nodes_form(const sexp& s) {
    auto f = split(s, 1, 64, {}, "(nodes (NAME N) ...)", true);
    if (!prog_.nodes.empty())
      fail(s, "(nodes ...) is given twice");
    if (total_steps_ > 0)
      fail(s, "(nodes ...) comes right after (devices ...), before any work");
    for (const auto* x : f.pos) {
      bool second = x->is_list() && x->items().size() == 3;
      if (!x->is_list() || (x->items().size() != 2 && !second))
        fail(*x, "a node is (NAME N), its name and how many devices it serves, or (NAME N "
                 "(session-of OTHER)), a second session of node OTHER");
      int session_of = -1;
      if (second) {
        const auto& o = x->items()[2];
        if (!o.is_list() || o.items().size() != 2 || !o.items()[0].is_atom()
            || o.items()[0].as_atom() != "session-of")
          fail(o, "expected (session-of OTHER): OTHER, a node declared before, attached again "
                  "as a second client");
        session_of = lookup(o.items()[1], sym::node).id;
        if (prog_.nodes[static_cast<std::size_t>(session_of)].session_of >= 0)
          fail(o.items()[1], "(session-of ...) names a node declared with (session-of ...) "
                             "itself: name the node it is a session of");
      }
      auto n = new_name(x->items()[0], sym::node);
      int count = static_cast<int>(integer_in(x->items()[1], "the node's devices", 1, 256));
      if (session_of >= 0 && count != prog_.nodes[static_cast<std::size_t>(session_of)].devices)
        fail(x->items()[1], fmt::format("a session of node {} has its {} device(s)",
                                        prog_.nodes[static_cast<std::size_t>(session_of)].name,
                                        prog_.nodes[static_cast<std::size_t>(session_of)].devices));
      declare(n, x->items()[0], sym::node, static_cast<int>(prog_.nodes.size()));
      prog_.nodes.push_back(node_decl{n, count, prog_.devices, at(*x), session_of});
      prog_.devices += count;
    }
    prog_.items.assign(prog_.devices, 0);
    kernels_on_.assign(prog_.devices, 0);
  }

  /// `(kill-node NAME)`, `(cut-node NAME)`, `(detach NAME)`, `(attach NAME)`.
  void kill_node_form(const sexp& s, std::vector<step>& out) {
    const auto& head = s.items()[0].as_atom();
    auto kind = head == "cut-node" ? op::cut_node
                : head == "detach" ? op::detach_node
                : head == "attach" ? op::attach_node
                                   : op::kill_node;
    auto usage = fmt::format("({} NAME)", head);
    auto f = split(s, 1, 1, {}, usage.c_str());
    auto st = make(s, kind);
    st.device = -1;
    st.host = lookup(*f.pos[0], sym::node).id; // the node's index
    push(out, std::move(st));
  }

  void seed_form(const sexp& s) {
    auto f = split(s, 1, 1, {}, "(seed N)");
    if (script_seed_)
      fail(s, "(seed ...) is given twice");
    if (!prog_.dags.empty())
      fail(s, fmt::format("(seed ...) comes after (random-dag {} ...), which is drawn where it "
                          "stands: give the seed first",
                          prog_.dags.front().name));
    script_seed_ = static_cast<uint64_t>(integer_in(*f.pos[0], "the seed", 0, INT64_MAX));
    prog_.seed = seed_override_.value_or(*script_seed_);
  }

  void tnode_form(const sexp& s) {
    auto f = split(s, 1, 1, {"floats", "bytes", "mode"},
                   "(tnode NAME (floats N)|(bytes N) [(mode M)])");
    auto n = new_name(*f.pos[0], sym::tnode);
    if (f.opts.count("floats") == f.opts.count("bytes"))
      fail(s, fmt::format("tnode '{}' needs its size: (floats N) or (bytes N)", n));
    std::size_t size = 0;
    if (f.opts.count("floats"))
      size = sizeof(float) * static_cast<std::size_t>(integer_in(
                               opt_value(f, "floats"), "the number of floats", 1, int64_t{1} << 32));
    else
      size = static_cast<std::size_t>(
        integer_in(opt_value(f, "bytes"), "the size in bytes", 1, int64_t{1} << 34));
    memory_mode mode = memory_mode::on_device;
    if (f.opts.count("mode")) {
      const auto& m = opt_value(f, "mode");
      auto name = text(m, "a memory mode");
      static const std::pair<const char*, memory_mode> modes[] = {
        {"effectively_constant", memory_mode::effectively_constant},
        {"virtual", memory_mode::virtual_},
        {"never_virtual", memory_mode::never_virtual},
        {"local", memory_mode::local},
        {"device_only", memory_mode::device_only},
        {"on_device", memory_mode::on_device},
        {"materialized", memory_mode::materialized}};
      auto it = std::find_if(std::begin(modes), std::end(modes),
                             [&](const auto& p) { return name == p.first; });
      if (it == std::end(modes))
        fail(m, fmt::format("unknown memory mode '{}'; one of effectively_constant, virtual, "
                            "never_virtual, local, device_only, on_device, materialized",
                            name));
      mode = it->second;
    }
    int id = static_cast<int>(prog_.tnodes.size());
    prog_.tnodes.push_back(tnode{id + 1, n, size, mode});
    declare(n, *f.pos[0], sym::tnode, id);
  }

  int new_context(const sexp& name_at, const std::string& n, int dev) {
    int id = static_cast<int>(prog_.contexts.size());
    prog_.contexts.push_back(n);
    ctx_device_.push_back(dev);
    ctx_nodes_.emplace_back();
    declare(n, name_at, sym::context, id);
    return id;
  }

  void context_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, 2, {}, "(context NAME DEVICE)");
    auto n = new_name(*f.pos[0], sym::context);
    auto st = make(s, op::make_context);
    st.device = device(*f.pos[1]);
    st.ctx = new_context(*f.pos[0], n, st.device);
    push(out, std::move(st));
  }

  void child_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, 2, {}, "(child NAME PARENT)");
    auto n = new_name(*f.pos[0], sym::context);
    auto st = make(s, op::make_child);
    st.parent = lookup(*f.pos[1], sym::context).id;
    st.device = ctx_device_[st.parent];
    st.ctx = new_context(*f.pos[0], n, st.device);
    ctx_nodes_[st.ctx] = ctx_nodes_[st.parent];
    push(out, std::move(st));
  }

  int context_var(const sexp& s) const {
    return lookup(s, sym::context).id;
  }

  void alloc_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, SIZE_MAX, {}, "(alloc CTX TNODE...)");
    auto st = make(s, op::alloc_node);
    st.ctx = context_var(*f.pos[0]);
    st.device = ctx_device_[st.ctx];
    for (std::size_t i = 1; i < f.pos.size(); ++i) {
      int t = lookup(*f.pos[i], sym::tnode).id;
      st.tnodes.push_back(t);
      ctx_nodes_[st.ctx].insert(t);
    }
    push(out, std::move(st));
  }

  void pool_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 3, 3, {"align"}, "(pool DEVICE POOL-ID BYTES [(align A)])");
    auto st = make(s, op::alloc_pool);
    st.device = device(*f.pos[0]);
    st.pool_id = integer_in(*f.pos[1], "the pool id", 0, INT32_MAX);
    st.bytes = integer_in(*f.pos[2], "the pool's size in bytes", 0, int64_t{1} << 34);
    if (f.opts.count("align"))
      st.align = integer_in(opt_value(f, "align"), "the alignment", 1, 1 << 20);
    push(out, std::move(st));
  }

  void free_pool_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, 2, {}, "(free-pool DEVICE POOL-ID)");
    auto st = make(s, op::free_pool);
    st.device = device(*f.pos[0]);
    st.pool_id = integer_in(*f.pos[1], "the pool id", 0, INT32_MAX);
    push(out, std::move(st));
  }

  void memset_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 4, 4, {"as"}, "(memset DEVICE POOL-ID OFFSET BYTES [(as EV)])");
    auto st = make(s, op::memset);
    st.device = device(*f.pos[0]);
    st.pool_id = integer_in(*f.pos[1], "the pool id", 0, INT32_MAX);
    st.offset = integer_in(*f.pos[2], "the offset", 0, int64_t{1} << 34);
    st.bytes = integer_in(*f.pos[3], "the size in bytes", 0, int64_t{1} << 34);
    st.as = opt_event(f);
    push(out, std::move(st));
  }

  /// Counts a kernel item on `st.device` and applies a pending `fail-at`.
  void count_kernel(step& st) {
    if (in_round_ >= 0)
      return; // a round's kernels run at its replays: (fail-at D K) counts none
    auto n = ++kernels_on_[st.device];
    auto& faults = pending_faults_[st.device];
    if (auto it = faults.find(n); it != faults.end()) {
      st.fail_with = it->second.first;
      faults.erase(it);
      if (faults.empty())
        pending_faults_.erase(st.device);
    }
  }

  void kernel_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, SIZE_MAX, {"as"}, "(kernel CTX NAME ARG... [(as EV)])");
    auto st = make(s, op::kernel);
    ctx(*f.pos[0], st);
    st.kernel = text(*f.pos[1], "a kernel name");
    auto def = find_kernel(st.kernel);
    if (!def) {
      std::string known;
      for (const auto& k : kernel_names())
        known += (known.empty() ? "" : ", ") + k;
      fail(*f.pos[1], fmt::format("unknown kernel '{}'; the kernels are {}", st.kernel, known));
    }
    std::size_t given = f.pos.size() - 2;
    if (given != def->params.size())
      fail(s, fmt::format("kernel '{}' takes {} argument(s), got {}", st.kernel,
                          def->params.size(), given));
    for (std::size_t i = 0; i < given; ++i) {
      const auto& a = *f.pos[i + 2];
      switch (def->params[i]) {
        case arg_kind::integer:
          st.args.emplace_back(integer(a, fmt::format("argument {} of kernel '{}'", i + 1,
                                                      st.kernel).c_str()));
          break;
        case arg_kind::real:
          st.args.emplace_back(real(a, fmt::format("argument {} of kernel '{}'", i + 1,
                                                   st.kernel).c_str()));
          break;
        case arg_kind::string:
          st.args.emplace_back(text(a, "a string", false));
          break;
        case arg_kind::buffer:
          st.args.emplace_back(prog_.tnodes[node_in(a, st)]);
          break;
      }
    }
    st.as = opt_event(f);
    count_kernel(st);
    push(out, std::move(st));
  }

  void checksum_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, 2, {"as"}, "(checksum CTX TNODE (as NAME))");
    if (!f.opts.count("as"))
      fail(s, "(checksum CTX TNODE) needs (as NAME): the name its result is read by");
    auto st = make(s, op::kernel);
    ctx(*f.pos[0], st);
    st.kernel = "checksum";
    int t = node_in(*f.pos[1], st);
    st.as = opt_event(f);
    st.args = {prog_.tnodes[t], prog_.event_name(st.as)};
    checksums_.insert(st.as);
    count_kernel(st);
    push(out, std::move(st));
  }

  void wait_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, 2, {}, "(wait CTX EVENT)");
    auto st = make(s, op::wait);
    ctx(*f.pos[0], st);
    st.ev = event(*f.pos[1]);
    push(out, std::move(st));
  }

  void all_work_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, 1, {"as"}, "(all-work DEVICE (as EV))");
    if (!f.opts.count("as"))
      fail(s, "(all-work DEVICE) needs (as EV): the name of the event it makes");
    auto st = make(s, op::all_work);
    st.device = device(*f.pos[0]);
    st.as = opt_event(f);
    push(out, std::move(st));
  }

  void event_form(const sexp& s, std::vector<step>& out, op k) {
    auto f = split(s, 1, 1, {}, "(sync EVENT)");
    auto st = make(s, k);
    st.ev = event(*f.pos[0]);
    push(out, std::move(st));
  }

  void device_form(const sexp& s, std::vector<step>& out) {
    const auto& head = s.items()[0].as_atom();
    auto f = split(s, 1, 1, {}, fmt::format("({} DEVICE)", head).c_str());
    op k = head == "await"       ? op::await
           : head == "cancel"    ? op::cancel
           : head == "recover"   ? op::recover
                                 : op::sync_device;
    auto st = make(s, k);
    st.device = device(*f.pos[0]);
    push(out, std::move(st));
  }

  void from_host_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 3, 3, {"as"}, "(from-host CTX TNODE (fill V)|(iota START)|(values V...))");
    auto st = make(s, op::from_host);
    st.ctx = context_var(*f.pos[0]);
    st.device = ctx_device_[st.ctx];
    int t = lookup(*f.pos[1], sym::tnode).id;
    st.tnodes = {t};
    const auto& d = *f.pos[2];
    std::size_t n = prog_.tnodes[t].size_in_bytes / sizeof(float);
    if (prog_.tnodes[t].size_in_bytes % sizeof(float) != 0)
      fail(*f.pos[1], fmt::format("tnode '{}' is not a whole number of floats",
                                  prog_.tnodes[t].label));
    if (!d.is_list() || d.items().empty() || !d.items()[0].is_atom())
      fail(d, "expected host data: (fill V), (iota START) or (values V...)");
    auto how = d.items()[0].as_atom();
    if (how == "fill" || how == "iota") {
      if (d.items().size() != 2)
        fail(d, fmt::format("({} ...) takes one number", how));
      st.data.how = how == "fill" ? host_data::kind::fill : host_data::kind::iota;
      st.data.value = real(d.items()[1], "a number");
    } else if (how == "values") {
      st.data.how = host_data::kind::values;
      for (std::size_t i = 1; i < d.items().size(); ++i)
        st.data.values.push_back(static_cast<float>(real(d.items()[i], "a number")));
      if (st.data.values.size() != n)
        fail(d, fmt::format("tnode '{}' holds {} floats, (values ...) gives {}",
                            prog_.tnodes[t].label, n, st.data.values.size()));
    } else {
      fail(d.items()[0], fmt::format("unknown host data '{}'; use (fill V), (iota START) or "
                                     "(values V...)", how));
    }
    st.as = opt_event(f);
    ctx_nodes_[st.ctx].insert(t);
    push(out, std::move(st));
  }

  void to_host_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, 2, {"as"}, "(to-host CTX TNODE (as HOST))");
    if (!f.opts.count("as"))
      fail(s, "(to-host CTX TNODE) needs (as HOST): the name expectations read it by");
    auto st = make(s, op::to_host);
    st.ctx = context_var(*f.pos[0]);
    st.device = ctx_device_[st.ctx];
    int t = node_in(*f.pos[1], st);
    if (prog_.tnodes[t].size_in_bytes % sizeof(float) != 0)
      fail(*f.pos[1], fmt::format("tnode '{}' is not a whole number of floats",
                                  prog_.tnodes[t].label));
    st.tnodes = {t};
    const auto& h = opt_value(f, "as");
    auto n = new_name(h, sym::host);
    st.host = static_cast<int>(prog_.hosts.size());
    prog_.hosts.push_back(host_decl{n, t});
    declare(n, h, sym::host, st.host);
    push(out, std::move(st));
  }

  void copy_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, 1, {"from", "to", "into", "as"},
                   "(copy TNODE (from CTX) (to CTX) [(into merge)] [(as EV)])");
    if (!f.opts.count("from") || !f.opts.count("to"))
      fail(s, "(copy TNODE ...) needs (from CTX) and (to CTX)");
    auto st = make(s, op::copy);
    st.ctx2 = context_var(opt_value(f, "from"));
    st.ctx = context_var(opt_value(f, "to"));
    st.device = ctx_device_[st.ctx];
    step src;
    src.ctx = st.ctx2;
    int t = node_in(*f.pos[0], src);
    st.tnodes = {t};
    if (ctx_device_[st.ctx] == ctx_device_[st.ctx2])
      fail(s, fmt::format("copy: from and to are both on device {}", st.device));
    if (f.opts.count("into")) {
      const auto& i = opt_value(f, "into");
      if (text(i, "merge") != "merge")
        fail(i, "(into ...) takes 'merge' (the destination's merge buffer)");
      st.into_merge = true;
    } else {
      ctx_nodes_[st.ctx].insert(t);
    }
    st.as = opt_event(f);
    push(out, std::move(st));
  }

  void kill_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, 2, {}, "(kill DEVICE [REASON])");
    auto st = make(s, op::kill);
    st.device = device(*f.pos[0]);
    local_only(s, st.device, "kill (use (kill-node NAME) for a node)");
    st.message = f.pos.size() > 1 ? text(*f.pos[1], "a reason", false) : "killed by the scenario";
    push(out, std::move(st));
  }

  void delay_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, 2, {"as"}, "(delay DEVICE MS [(as EV)])");
    auto st = make(s, op::delay);
    st.device = device(*f.pos[0]);
    st.ms = real(*f.pos[1], "the delay in milliseconds");
    if (st.ms < 0 || st.ms > 60'000)
      fail(*f.pos[1], fmt::format("a delay must be 0 to 60000 ms, got {}", st.ms));
    st.as = opt_event(f);
    push(out, std::move(st));
  }

  void hold_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, 1, {"as"}, "(hold DEVICE (as HOLD))");
    if (!f.opts.count("as"))
      fail(s, "(hold DEVICE) needs (as HOLD): the name (release HOLD) uses");
    auto st = make(s, op::hold);
    st.device = device(*f.pos[0]);
    local_only(s, st.device, "hold");
    const auto& h = opt_value(f, "as");
    auto n = new_name(h, sym::hold);
    st.hold = static_cast<int>(prog_.holds.size());
    prog_.holds.push_back(n);
    declare(n, h, sym::hold, st.hold);
    push(out, std::move(st));
  }

  void sync_in_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 2, 2, {"as"}, "(sync-in DEVICE EVENT [(as EV)])");
    auto st = make(s, op::sync_in);
    st.device = device(*f.pos[0]);
    // EVENT may be made by a later step: it is looked up once the whole
    // script is read (see `load`). On a node's device it is a wait queued
    // there, which needs the event now.
    const auto& e = *f.pos[1];
    auto n = text(e, "an event");
    if (find_name(n))
      st.ev = lookup(e, sym::event).id;
    else if (st.device >= prog_.local_devices)
      fail(e, fmt::format("sync-in on {}: event '{}' is not made by an earlier step. On a "
                          "node's device sync-in is a wait for the event queued there (a task "
                          "that blocks in sync until a later step makes it needs a closure on "
                          "the node's runner, which does not travel): make '{}' first",
                          node_device_name(st.device), n, n));
    else
      forward_events_.push_back({&e, n, out.size(), &out, at(e)});
    if (st.device >= prog_.local_devices)
      prog_.items[static_cast<std::size_t>(st.device)] += 1; // the wait before its task
    st.as = opt_event(f);
    push(out, std::move(st));
  }

  /// A time in milliseconds: a number of milliseconds (`5`, `0.5`, `(* 2
  /// $i)`), or a number with its unit, `ns`, `us`, `ms` or `s` (`5ms`,
  /// `250us`, `1.5s`).
  double milliseconds(const sexp& s, const char* what) const {
    if (s.is_list())
      return real(s, what);
    auto t = text(s, what);
    std::string_view num{t};
    double scale = 1.0;
    static const std::pair<const char*, double> units[] = {
      {"ns", 1e-6}, {"us", 1e-3}, {"ms", 1.0}, {"s", 1e3}};
    for (const auto& [unit, factor] : units)
      if (num.ends_with(unit)) {
        num.remove_suffix(std::string_view{unit}.size());
        scale = factor;
        break;
      }
    double v = 0;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (num.empty() || ec != std::errc{} || end != num.data() + num.size() || !std::isfinite(v))
      fail(s, fmt::format("{} must be a number of milliseconds or a time such as 5ms, 250us, "
                          "1.5s, got '{}'",
                          what, t));
    return v * scale;
  }

  /// `(sleep TIME)`: the script waits that long before its next step.
  void sleep_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, 1, {}, "(sleep TIME), e.g. (sleep 5ms)");
    auto st = make(s, op::sleep);
    st.ms = milliseconds(*f.pos[0], "the time to sleep");
    if (st.ms < 0 || st.ms > 60'000)
      fail(*f.pos[0], fmt::format("a sleep must be 0 to 60000 ms, got {} ms", st.ms));
    push(out, std::move(st));
  }

  /// `(await-hold HOLD)`: the host waits until the device's runner is in it.
  void await_hold_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, 1, {}, "(await-hold HOLD)");
    auto st = make(s, op::await_hold);
    st.hold = lookup(*f.pos[0], sym::hold).id;
    push(out, std::move(st));
  }

  void release_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, 1, {}, "(release HOLD)");
    auto st = make(s, op::release);
    st.hold = lookup(*f.pos[0], sym::hold).id;
    push(out, std::move(st));
  }

  void fail_at_form(const sexp& s) {
    auto f = split(s, 2, 3, {}, "(fail-at EVENT MESSAGE) or (fail-at DEVICE STEP MESSAGE)");
    if (f.pos.size() == 2)
      return aimed_fault_form(s);
    int d = device(*f.pos[0]);
    auto n = integer_in(*f.pos[1], "the step (the device's n-th kernel, from 1)", 1, INT64_MAX);
    if (n <= static_cast<int64_t>(kernels_on_[d]))
      fail(*f.pos[1], fmt::format("fail-at: the script schedules {} kernel(s) on device {} "
                                  "before this form, so kernel number {} is behind it",
                                  kernels_on_[d], d, n));
    auto& faults = pending_faults_[d];
    if (faults.count(static_cast<uint64_t>(n)))
      fail(s, fmt::format("fail-at: step {} of device {} already fails", n, d));
    faults[static_cast<uint64_t>(n)] = {text(*f.pos[2], "a message", false), at(s)};
  }

  /// `(fail-at EVENT MESSAGE)`, `(delay-at EVENT MS)`, `(cancel-at EVENT)`:
  /// a fault aimed at the item that makes EVENT. The event may be made by a
  /// later step, so the name is resolved once the whole script is read
  /// (`resolve_aimed_faults`).
  void aimed_fault_form(const sexp& s) {
    const auto& head = s.items()[0].as_atom();
    aimed_fault a;
    a.head = head;
    if (head == "fail-at") {
      auto f = split(s, 2, 2, {}, "(fail-at EVENT MESSAGE)");
      a.message = text(*f.pos[1], "a message", false);
      a.name = text(*f.pos[0], "an event");
      a.name_at = at(*f.pos[0]);
    } else if (head == "delay-at") {
      auto f = split(s, 2, 2, {}, "(delay-at EVENT TIME), e.g. (delay-at e 3ms)");
      a.ms = milliseconds(*f.pos[1], "the delay");
      if (a.ms <= 0 || a.ms > 60'000)
        fail(*f.pos[1], fmt::format("delay-at: a delay must be above 0 and at most 60000 ms, "
                                    "got {}",
                                    a.ms));
      a.name = text(*f.pos[0], "an event");
      a.name_at = at(*f.pos[0]);
    } else if (head == "cancel-at") {
      auto f = split(s, 1, 1, {}, "(cancel-at EVENT)");
      a.name = text(*f.pos[0], "an event");
      a.name_at = at(*f.pos[0]);
    } else {
      auto usage = fmt::format("({} EVENT [NODE])", head);
      auto f = split(s, 1, 2, {}, usage.c_str());
      a.name = text(*f.pos[0], "an event");
      a.name_at = at(*f.pos[0]);
      if (f.pos.size() > 1)
        a.node = lookup(*f.pos[1], sym::node).id;
    }
    a.where = at(s);
    a.text = substituted(s);
    aimed_.push_back(std::move(a));
  }

  /// Aims each `fail-at`/`delay-at`/`cancel-at` by name at the task step
  /// that makes its event (in the script or as an expected action).
  void resolve_aimed_faults() {
    if (aimed_.empty())
      return;
    std::vector<step*> maker(static_cast<std::size_t>(prog_.event_ids), nullptr);
    auto note = [&](step& st) {
      if (st.as >= 0)
        maker[static_cast<std::size_t>(st.as)] = &st;
    };
    // An event of a family: its iteration's copy of the template step
    // (iteration 0's), whose fault fields go to `program::family_faults`.
    std::map<int, step> iteration;
    auto maker_of = [&](int id) -> step* {
      auto l = locate_event(prog_.families, id);
      if (l.family < 0)
        return maker[static_cast<std::size_t>(id)];
      const auto& fam = prog_.families[static_cast<std::size_t>(l.family)];
      step* tmpl = maker[static_cast<std::size_t>(fam.first + l.slot)];
      if (!tmpl)
        return nullptr;
      auto [it, added] = iteration.try_emplace(id, *tmpl);
      return &it->second;
    };
    for (auto& st : prog_.steps) {
      note(st);
      if (st.action)
        note(*st.action);
    }
    std::map<const step*, const aimed_fault*> taken;
    for (const auto& a : aimed_) {
      auto it = find_name(a.name);
      if (!it)
        throw script_error(a.name_at, fmt::format("{}: unknown event '{}': no step of the "
                                                  "script makes it",
                                                  a.head, a.name));
      if (it->kind != sym::event)
        throw script_error(a.name_at,
                           fmt::format("{}: '{}' is {} (declared at {}:{}), not an event: {} "
                                       "aims at the task that a step makes with (as EVENT)",
                                       a.head, a.name, sym_name(it->kind),
                                       it->where.line, it->where.column, a.head));
      if (auto r = prog_.events[locate_event(prog_.families, it->id).decl].round; r >= 0) {
        const auto& rd = prog_.rounds[static_cast<std::size_t>(r)];
        throw script_error(a.name_at,
                           fmt::format("{}: event '{}' is an item of round '{}' (at {}:{}): "
                                       "faults cannot be aimed inside a round (a (kernel D "
                                       "fail MESSAGE) in its body fails every replay)",
                                       a.head, a.name, rd.name, rd.where.line,
                                       rd.where.column));
      }
      step* st = maker_of(it->id);
      if (!st)
        throw script_error(a.name_at, fmt::format("{}: no step makes event '{}'", a.head,
                                                  a.name));
      if (a.head == "kill-node-at" || a.head == "cut-node-at") {
        aim_node_fault(a, *st);
        continue;
      }
      if (!st || (st->kind != op::kernel && st->kind != op::delay && st->kind != op::sync_in)) {
        auto head = st ? st->text.substr(0, st->text.find_first_of(" )")) + " ...)" : "?";
        throw script_error(a.name_at,
                           fmt::format("{}: event '{}' is made by {} at {}:{}, which is not a "
                                       "task: {} aims at kernel, checksum, delay, sync-in and "
                                       "random-dag tasks",
                                       a.head, a.name, head, st ? st->where.line : 0,
                                       st ? st->where.column : 0, a.head));
      }
      if (st->fail_with || st->held_ms > 0 || st->cancel_here) {
        auto t = taken.find(st);
        throw script_error(a.where,
                           fmt::format("{}: the task of event '{}' already has a fault, {}: a "
                                       "task takes one",
                                       a.head, a.name,
                                       t != taken.end()
                                         ? fmt::format("{} at {}:{}", t->second->text,
                                                       t->second->where.line,
                                                       t->second->where.column)
                                         : fmt::format("a (fail-at {} K ...) that counts "
                                                       "its kernels",
                                                       st->device)));
      }
      if (a.head != "fail-at" && st->device >= prog_.local_devices)
        throw script_error(a.where, on_a_node(st->device, a.head.c_str()));
      taken[st] = &a;
      if (a.head == "fail-at") {
        st->fail_with = a.message;
      } else if (a.head == "delay-at") {
        st->held_ms = a.ms;
      } else {
        st->cancel_here = true;
        prog_.items[static_cast<std::size_t>(st->device)] += 1; // the hold before it
      }
    }
    for (const auto& [id, st] : iteration)
      prog_.family_faults[id] = family_fault{st.fail_with, st.held_ms, st.cancel_here,
                                             st.node_fault, st.node_cut};
  }

  /// `(kill-node-at EV [NODE])`, `(cut-node-at EV [NODE])`: NODE, by
  /// default the node of EV's device, is stopped right after the step `st`
  /// that makes EV.
  void aim_node_fault(const aimed_fault& a, step& st) {
    int node = a.node;
    if (node < 0) {
      for (std::size_t n = 0; n < prog_.nodes.size(); ++n)
        if (st.device >= prog_.nodes[n].first
            && st.device < prog_.nodes[n].first + prog_.nodes[n].devices)
          node = static_cast<int>(n);
      if (node < 0)
        throw script_error(a.name_at,
                           fmt::format("{}: event '{}' is made on {}, not on a node's device: "
                                       "name the node, ({} {} NODE)",
                                       a.head, a.name,
                                       st.device >= 0 ? fmt::format("device {}", st.device)
                                                      : std::string{"no device"},
                                       a.head, a.name));
    }
    if (st.node_fault >= 0)
      throw script_error(a.where, fmt::format("{}: the step that makes event '{}' already stops "
                                              "node {} after it: a step takes one",
                                              a.head, a.name, prog_.nodes[st.node_fault].name));
    st.node_fault = node;
    st.node_cut = a.head == "cut-node-at";
  }

  void repeat_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, SIZE_MAX, {"var"}, "(repeat N [(var NAME)] FORM...)", true);
    auto n = integer_in(*f.pos[0], "the repeat count", 0, int64_t{max_steps});
    std::string var = "i";
    if (f.opts.count("var")) {
      const auto& v = opt_value(f, "var");
      var = text(v, "a variable name");
      if (var.empty() || !std::all_of(var.begin(), var.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
          }))
        fail(v, fmt::format("'{}' cannot name a loop variable (letters, digits, _)", var));
    }
    if (param_names_.count(var))
      fail(s, fmt::format("loop variable '${}' is already a (param {} ...)", var, var));
    if (vars_.count(var))
      fail(s, fmt::format("loop variable '${}' is already used by an enclosing repeat", var));
    // Iterations that are all alike load once (a repeat_block): what the
    // first one added to the counters, the others add without reading the
    // body again.
    // (count_kernel leaves an empty map behind for each device it counted.)
    bool no_faults = std::all_of(pending_faults_.begin(), pending_faults_.end(),
                                 [](const auto& d) { return d.second.empty(); });
    bool alike = n >= 2 && &out == &prog_.steps && no_faults
                 && std::all_of(f.pos.begin() + 1, f.pos.end(),
                                [&](const sexp* x) { return alike_body(*x, var); });
    // Iterations that differ only in the names they bind (`(as k$i)`) load
    // once too, their names kept as patterns (an `event_family`).
    std::vector<named_form> named;
    bool named_ok = !alike && n >= 2 && &out == &prog_.steps && no_faults
                    && named_loop(f, var, named);
    auto first_step = out.size();
    auto first_event = prog_.event_ids;
    auto first_decl = prog_.events.size();
    auto expanded_before = expanded_;
    auto kernels_before = kernels_on_;
    auto items_before = prog_.items;
    for (int64_t i = 0; i < n; ++i) {
      expand(s);
      vars_[var] = i;
      auto before = total_steps_;
      for (std::size_t k = 1; k < f.pos.size(); ++k)
        statement(*f.pos[k], out);
      current_ = &s;
      // One iteration tells the size of all: refuse a loop that would pass
      // the limit before expanding it.
      auto per_iteration = total_steps_ - before;
      if (i == 0 && per_iteration > 0
          && static_cast<double>(per_iteration) * static_cast<double>(n)
               > static_cast<double>(max_steps - before))
        fail(s, fmt::format("(repeat {} ...) would expand to {} steps, more than the limit of {}",
                            n, static_cast<double>(per_iteration) * static_cast<double>(n),
                            max_steps));
      auto more = static_cast<std::size_t>(n - 1);
      auto per_expansion = expanded_ - expanded_before;
      // Room for the iterations to come, which the check above bounds: no
      // moving every step each time the vector grows.
      // At least doubling, as push_back would: loops of other sizes inside
      // outer loops reserve again.
      if (auto want = out.size() + (out.size() - first_step) * more;
          i == 0 && !alike && n > 1 && want > out.capacity())
        out.reserve(std::max(want, 2 * out.capacity()));
      // A loop kept once counts its other iterations as run: steps,
      // expansion, kernels and items per device.
      auto count_the_rest = [&] {
        total_steps_ += per_iteration * more;
        expanded_ += per_expansion * more;
        for (std::size_t d = 0; d < kernels_on_.size(); ++d)
          kernels_on_[d] += (kernels_on_[d] - kernels_before[d]) * more;
        for (std::size_t d = 0; d < prog_.items.size(); ++d)
          prog_.items[d] += (prog_.items[d] - items_before[d]) * more;
      };
      if (i == 0 && alike && per_iteration > 0 && out.size() > first_step
          && per_expansion <= (max_expansion - expanded_) / more) {
        // Past the limit, the loop expands as before, to fail where it did.
        count_the_rest();
        prog_.repeats.push_back(
          repeat_block{first_step, out.size() - first_step, static_cast<uint64_t>(n)});
        break;
      }
      if (i == 0 && named_ok && per_iteration > 0 && out.size() - first_step == named.size()
          && per_expansion <= (max_expansion - expanded_) / more
          && make_family(f, out, var, n, named, first_step, first_event, first_decl)) {
        count_the_rest();
        break;
      }
    }
    vars_.erase(var);
  }

  /// A form of a loop body whose iterations differ in names only: the
  /// `(as NAME)` it binds (as written, `k$i`), if any, and whether its
  /// event (of a `wait` or `sync`) is one of the same iteration's.
  struct named_form {
    std::string as;
    bool ev_follows = false;
    /// A kernel's arguments that are affine in the variable (`$i`, `(* 2
    /// $i)`, `(+ $i 1)`): (index among the form's items, among the kernel's
    /// arguments).
    std::vector<std::pair<std::size_t, std::size_t>> varying;
  };

  /// Whether the body of `(repeat N (var VAR) ...)` (its forms `f.pos[1..]`)
  /// does the same in every iteration but for the names it binds: step
  /// forms (those of `alike_body` but `repeat`, and `all-work`) in which
  /// the loop variable appears only as `$VAR`, once, in a name an `(as
  /// ...)` binds, and as a `wait`'s or `sync`'s event written as one such
  /// name of an earlier form (the same iteration's event). With at least
  /// one such name; `${...}` nowhere.
  static bool named_loop(const form& f, const std::string& var, std::vector<named_form>& out) {
    static const std::set<std::string> steps{"kernel", "memset", "delay", "wait", "sync",
                                             "await", "sync-device", "sleep", "all-work"};
    auto dollar_var = [&](const std::string& a) {
      // Occurrences of `$var` as a whole token.
      int count = 0;
      for (auto at = var_token_at(a, var); at != std::string::npos;
           at = var_token_at(a, var, at + 1))
        ++count;
      return count;
    };
    auto names_var = [&](const std::string& a) { return mentions_var(a, var); };
    std::function<bool(const sexp&)> plain = [&](const sexp& x) {
      if (x.is_atom())
        return !names_var(x.as_atom());
      return std::all_of(x.items().begin(), x.items().end(), plain);
    };
    // `$var`, or +, - and * (by one such term at most) of such terms and
    // plain ones: a whole number a + b * var.
    std::function<bool(const sexp&)> affine = [&](const sexp& x) {
      if (x.is_atom())
        return x.as_atom() == "$" + var;
      const auto& xs = x.items();
      if (xs.size() < 3 || !xs[0].is_atom())
        return false;
      const auto& o = xs[0].as_atom();
      if (o != "+" && o != "-" && o != "*")
        return false;
      int varying = 0;
      for (std::size_t j = 1; j < xs.size(); ++j) {
        if (plain(xs[j]))
          continue;
        if (!affine(xs[j]))
          return false;
        ++varying;
      }
      return o != "*" || varying <= 1;
    };
    bool any = false;
    for (std::size_t k = 1; k < f.pos.size(); ++k) {
      const auto& s = *f.pos[k];
      if (!s.is_list() || s.items().empty() || !s.items()[0].is_atom()
          || !steps.count(s.items()[0].as_atom()))
        return false;
      const auto& head = s.items()[0].as_atom();
      named_form nf;
      std::size_t ev_at = head == "wait" ? 2 : head == "sync" ? 1 : 0;
      std::size_t positional = 0;
      for (std::size_t j = 1; j < s.items().size(); ++j) {
        const auto& x = s.items()[j];
        bool option = x.is_list() && !x.items().empty() && x.items()[0].is_atom()
                      && x.items()[0].as_atom() == "as";
        if (!option)
          ++positional;
        if (head == "kernel" && !option && positional >= 3 && !plain(x) && affine(x)) {
          nf.varying.emplace_back(j, positional - 3);
          continue;
        }
        if (x.is_list() && x.items().size() == 2 && x.items()[0].is_atom()
            && x.items()[0].as_atom() == "as" && x.items()[1].is_atom()) {
          const auto& a = x.items()[1].as_atom();
          if (!nf.as.empty() || a.find("${") != std::string::npos || dollar_var(a) != 1)
            return false;
          nf.as = a;
          continue;
        }
        if (j == ev_at && x.is_atom() && names_var(x.as_atom())) {
          bool earlier = std::any_of(out.begin(), out.end(),
                                     [&](const named_form& o) { return o.as == x.as_atom(); });
          if (!earlier)
            return false;
          nf.ev_follows = true;
          continue;
        }
        if (!plain(x))
          return false;
      }
      any = any || !nf.as.empty() || !nf.varying.empty();
      out.push_back(std::move(nf));
    }
    return any;
  }

  /// After iteration 0 of a named loop (`named_loop`) loaded its steps
  /// `out[first_step..]` and its events (ids from `first_event`, decls from
  /// `first_decl`): keeps them as an `event_family` standing for all `n`
  /// iterations, unless a name of a later iteration could be one already
  /// declared (then the loop expands as before, to fail where it did).
  bool make_family(const form& f, std::vector<step>& out, const std::string& var, int64_t n,
                   const std::vector<named_form>& named, std::size_t first_step,
                   int first_event, std::size_t first_decl) {
    int per_iter = prog_.event_ids - first_event;
    auto binds = std::count_if(named.begin(), named.end(),
                               [](const named_form& x) { return !x.as.empty(); });
    if (per_iter != binds || prog_.events.size() - first_decl != static_cast<std::size_t>(binds))
      return false;
    // The names' parts around `$var`, the other variables substituted.
    std::vector<name_pattern> pats;
    int slot = 0;
    for (const auto& nf : named) {
      if (nf.as.empty())
        continue;
      const auto& a = nf.as;
      auto at = var_token_at(a, var);
      name_pattern p;
      p.prefix = text(sexp::atom(a.substr(0, at)), "a name");
      p.suffix = text(sexp::atom(a.substr(at + 1 + var.size())), "a name");
      if (p.prefix.empty() || looks_numeric(p.prefix))
        return false;
      p.first = first_event + slot;
      p.stride = per_iter;
      p.times = static_cast<uint64_t>(n);
      p.where = prog_.events[first_decl + static_cast<std::size_t>(slot)].where;
      pats.push_back(std::move(p));
      ++slot;
    }
    // No name of theirs may be one declared already (iteration 0's aside)
    // nor one another pattern may make. The number is a whole run of
    // digits (neither side of it ends in a digit), so two patterns make a
    // name alike only with the same key, or with the same shape and their
    // numbers in different runs: refused (the loop expands), as is a
    // shape whose patterns put their numbers in different runs.
    std::map<std::string, std::size_t> shapes;
    std::set<std::string> keys;
    for (const auto& p : pats) {
      if ((!p.prefix.empty() && std::isdigit(static_cast<unsigned char>(p.prefix.back())))
          || (!p.suffix.empty() && std::isdigit(static_cast<unsigned char>(p.suffix.front()))))
        return false;
      auto key = pattern_key(p.prefix, p.suffix);
      if (pattern_keys_.count(key) || !keys.insert(key).second)
        return false;
      auto [shape, run] = pattern_shape(p.prefix, p.suffix);
      auto known = pattern_shapes_.find(shape);
      if (known != pattern_shapes_.end() && known->second != run)
        return false;
      if (auto [it, added] = shapes.emplace(shape, run); !added && it->second != run)
        return false;
      for (auto it = names_.lower_bound(p.prefix);
           it != names_.end() && it->first.compare(0, p.prefix.size(), p.prefix) == 0; ++it)
        if (p.match(it->first)
            && !(it->second.kind == sym::event && it->second.id >= first_event
                 && it->second.id < first_event + per_iter))
          return false;
    }
    // A varying argument: its step per iteration, from iteration 1's value
    // (and its last iteration's, which must be in range and on the line).
    std::vector<std::vector<std::pair<std::size_t, int64_t>>> arg_steps(named.size());
    for (std::size_t k = 0; k < named.size(); ++k) {
      const auto& st = out[first_step + k];
      for (auto [item, arg] : named[k].varying) {
        const auto& x = f.pos[k + 1]->items()[item];
        if (arg >= st.args.size())
          return false;
        auto at_iteration = [&](int64_t t) -> std::optional<int64_t> {
          vars_[var] = t;
          try {
            if (std::holds_alternative<int64_t>(st.args[arg]))
              return integer(x, "an argument");
            if (!std::holds_alternative<double>(st.args[arg]))
              return std::nullopt;
            auto v = real(x, "an argument");
            if (std::abs(v) >= 0x1p53 || v != std::trunc(v))
              return std::nullopt;
            return static_cast<int64_t>(v);
          } catch (const script_error&) {
            return std::nullopt;
          }
        };
        auto v0 = at_iteration(0), v1 = at_iteration(1), last = at_iteration(n - 1);
        vars_[var] = 0;
        int64_t d = 0, want = 0;
        if (!v0 || !v1 || !last || __builtin_sub_overflow(*v1, *v0, &d)
            || __builtin_mul_overflow(d, n - 1, &want) || __builtin_add_overflow(want, *v0, &want)
            || want != *last)
          return false;
        arg_steps[k].emplace_back(arg, d);
      }
    }
    // Iteration 0's names become the patterns'.
    for (int j = 0; j < per_iter; ++j)
      names_.erase(prog_.events[first_decl + static_cast<std::size_t>(j)].name);
    event_family fam;
    fam.first = first_event;
    fam.per_iter = per_iter;
    fam.times = static_cast<uint64_t>(n);
    fam.decl = first_decl;
    fam.step = first_step;
    for (const auto& p : pats)
      fam.parts.emplace_back(p.prefix, p.suffix);
    // The forms' texts, the variable's value a marker the runner replaces.
    int64_t marker = 0;
    std::from_chars(text_marker, text_marker + std::strlen(text_marker), marker);
    vars_[var] = marker;
    for (std::size_t k = 1; k < f.pos.size(); ++k)
      fam.texts.push_back(substituted(*f.pos[k]));
    vars_[var] = 0;
    int id = static_cast<int>(prog_.families.size());
    for (std::size_t k = 0; k < named.size(); ++k) {
      auto& st = out[first_step + k];
      st.family = id;
      st.shifts_ev = named[k].ev_follows;
      st.arg_steps = std::move(arg_steps[k]);
    }
    prog_.families.push_back(std::move(fam));
    for (auto& p : pats) {
      pattern_keys_.emplace(pattern_key(p.prefix, p.suffix), patterns_.size());
      pattern_shapes_.insert(pattern_shape(p.prefix, p.suffix));
      patterns_.push_back(std::move(p));
    }
    prog_.event_ids = first_event + per_iter * static_cast<int>(n);
    prog_.repeats.push_back(
      repeat_block{first_step, named.size(), static_cast<uint64_t>(n), id});
    return true;
  }

  /// Whether the atom `a` may depend on the loop variable `var`: it is the
  /// variable, mentions `$var` (or a prefix of a longer `$name`: kept
  /// conservative), or holds a `${...}` expression.
  static bool mentions_var(const std::string& a, const std::string& var) {
    if (a == var || a.find("${") != std::string::npos)
      return true;
    for (auto at = a.find('$'); at != std::string::npos; at = a.find('$', at + 1))
      if (a.compare(at + 1, var.size(), var) == 0)
        return true;
    return false;
  }

  /// The position of the first `$var` in `a` at or after `from` that is a
  /// whole token (not the start of a longer `$name`), or npos.
  static std::size_t var_token_at(const std::string& a, const std::string& var,
                                  std::size_t from = 0) {
    for (auto at = a.find('$', from); at != std::string::npos; at = a.find('$', at + 1)) {
      auto end = at + 1 + var.size();
      if (a.compare(at + 1, var.size(), var) == 0
          && (end == a.size()
              || !(std::isalnum(static_cast<unsigned char>(a[end])) || a[end] == '_')))
        return at;
    }
    return std::string::npos;
  }

  /// Whether `s`, a form of a repeat's body, does the same in every
  /// iteration of the loop of variable `var`: a step form that neither
  /// names `var` (`$var`, `${...}`, or `var` bare in arithmetic) nor binds
  /// a name (an `(as ...)`), or a repeat of such forms. Loading it changes
  /// nothing the next iteration reads but the counters (steps, kernels
  /// per device for `fail-at DEVICE K`, items), so the loader reads it once.
  static bool alike_body(const sexp& s, const std::string& var) {
    static const std::set<std::string> steps{"kernel", "memset", "delay", "wait", "sync",
                                             "await", "sync-device", "sleep", "repeat"};
    if (!s.is_list() || s.items().empty() || !s.items()[0].is_atom()
        || !steps.count(s.items()[0].as_atom()))
      return false;
    auto names_var = [&](const std::string& a) { return mentions_var(a, var); };
    std::function<bool(const sexp&)> plain = [&](const sexp& x) {
      if (x.is_atom())
        return !names_var(x.as_atom());
      if (!x.items().empty() && x.items()[0].is_atom() && x.items()[0].as_atom() == "as")
        return false;
      return std::all_of(x.items().begin(), x.items().end(), plain);
    };
    if (s.items()[0].as_atom() == "repeat")
      for (std::size_t k = 2; k < s.items().size(); ++k)
        if (s.items()[k].is_list() && !s.items()[k].items().empty()
            && s.items()[k].items()[0].is_atom() && s.items()[k].items()[0].as_atom() != "var"
            && !alike_body(s.items()[k], var))
          return false;
    return plain(s);
  }

  void random_dag_form(const sexp& s, std::vector<step>& out) {
    auto f = split(s, 1, 1,
                   {"tasks", "devices", "max-deps", "work-ns", "window", "seed", "transfers",
                    "data", "faults"},
                   "(random-dag NAME (tasks N) [(devices D...)] [(max-deps K)] [(work-ns NS)] "
                   "[(window W)] [(seed S)] [(transfers P)] [(data)] [(faults K)])");
    auto name = new_name(*f.pos[0], sym::dag);
    if (!f.opts.count("tasks"))
      fail(s, "(random-dag NAME ...) needs (tasks N)");
    auto tasks = integer_in(opt_value(f, "tasks"), "the number of tasks", 1, 1'000'000);
    std::vector<int> devs;
    if (f.opts.count("devices")) {
      const auto& o = *f.opts.at("devices");
      for (std::size_t i = 1; i < o.items().size(); ++i)
        devs.push_back(device(o.items()[i]));
      if (devs.empty())
        fail(o, "(devices ...) lists no device");
    } else {
      for (int d = 0; d < prog_.devices; ++d)
        devs.push_back(d);
    }
    int64_t max_deps = f.opts.count("max-deps")
                         ? integer_in(opt_value(f, "max-deps"), "max-deps", 0, 64) : 2;
    int64_t work = f.opts.count("work-ns")
                     ? integer_in(opt_value(f, "work-ns"), "work-ns", 0, 1'000'000'000) : 1000;
    int64_t window = f.opts.count("window")
                       ? integer_in(opt_value(f, "window"), "window", 1, 1'000'000) : 16;
    dag_shape shape;
    if (f.opts.count("transfers")) {
      const auto& v = opt_value(f, "transfers");
      shape.transfers = real(v, "the fraction of transfers");
      if (shape.transfers < 0 || shape.transfers > 1)
        fail(v, fmt::format("the fraction of transfers must be between 0 and 1, got {}",
                            shape.transfers));
    }
    if (f.opts.count("data")) {
      const auto& o = *f.opts.at("data");
      if (o.items().size() != 1)
        fail(o, "(data) takes no value");
      shape.data = true;
    }
    if (f.opts.count("faults"))
      shape.faults = integer_in(opt_value(f, "faults"), "the number of faults", 0,
                                std::min<int64_t>(64, tasks));
    if ((shape.transfers > 0 || shape.data || shape.faults > 0) && tasks > max_dag_buffers)
      fail(s, fmt::format("(random-dag {} ...) with (transfers P), (data) or (faults K) takes "
                          "at most {} tasks, got {}",
                          name, max_dag_buffers, tasks));
    // The run's seed (--seed, else the script's (seed N), else 1), unless
    // the form fixes its own.
    uint64_t seed = prog_.seed;
    if (f.opts.count("seed"))
      seed = static_cast<uint64_t>(integer_in(opt_value(f, "seed"), "the seed", 0, INT64_MAX));
    std::mt19937_64 rng{seed};
    dag_decl dag{name, at(s), {}, devs, {}};
    std::vector<int> dev_of;
    std::vector<std::vector<int>> deps_of;
    for (int64_t i = 0; i < tasks; ++i) {
      int d = devs[rng() % devs.size()];
      dev_of.push_back(d);
      std::set<int64_t> deps;
      if (i > 0) {
        auto k = static_cast<int64_t>(rng() % static_cast<uint64_t>(max_deps + 1));
        for (int64_t j = 0; j < k; ++j) {
          auto lo = std::max<int64_t>(0, i - window);
          deps.insert(lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(i - lo)));
        }
      }
      auto& ds = deps_of.emplace_back();
      for (auto p : deps) {
        dag.edges.emplace_back(static_cast<int>(p), static_cast<int>(i));
        ds.push_back(static_cast<int>(p));
      }
      auto ev_name = fmt::format("{}.{}", name, i);
      if (find_name(ev_name))
        fail(s, fmt::format("duplicate name '{}' (random-dag {} names its tasks {}.0 ...)",
                            ev_name, name, name));
    }
    int dag_id = static_cast<int>(prog_.dags.size());
    if (shape.transfers > 0 || shape.data || shape.faults > 0)
      dag_with_options(s, out, dag, dag_id, shape, dev_of, deps_of, work, window, seed);
    else
      for (int64_t i = 0; i < tasks; ++i) {
        auto d = dev_of[i];
        for (auto p : deps_of[i]) {
          if (dev_of[p] == d)
            continue; // the device's own order
          auto w = make(s, op::wait);
          w.device = d;
          w.ev = dag.events[p];
          w.text = fmt::format("(wait {} {}.{})", d, name, p);
          push(out, std::move(w));
        }
        auto st = make(s, op::kernel);
        st.device = d;
        st.kernel = "spin_ns";
        st.args = {int64_t{work}};
        st.as = dag_event(s, dag, i);
        st.text = fmt::format("(kernel {} spin_ns {} (as {}.{}))", d, work, name, i);
        st.dag = dag_id;
        st.dag_task = static_cast<int>(i);
        count_kernel(st);
        push(out, std::move(st));
      }
    declare(name, *f.pos[0], sym::dag, dag_id);
    prog_.dags.push_back(std::move(dag));
  }

  /// The tasks a random DAG with options may have: each has a buffer (a
  /// pool) of its own, and copies to other devices.
  static constexpr int64_t max_dag_buffers = 100'000;

  /// A random DAG's options beyond its shape.
  struct dag_shape {
    double transfers = 0;
    bool data = false;
    int64_t faults = 0;
  };

  /// Declares task `i`'s event `NAME.i` and returns it.
  int dag_event(const sexp& s, dag_decl& dag, int64_t i) {
    auto ev_name = fmt::format("{}.{}", dag.name, i);
    int id = prog_.event_ids++;
    prog_.events.push_back(event_decl{ev_name, at(s)});
    declare(ev_name, s, sym::event, id);
    dag.events.push_back(id);
    return id;
  }

  /// A random DAG with `(transfers P)`, `(data)` or `(faults K)`. Every task
  /// owns a buffer of `dag_floats` floats (the tnode `NAME.i` in the DAG's
  /// context `NAME@D` of its device D) and is, on D: the copies and waits of
  /// its dependencies on other devices, `spin_ns NS`, `fill NAME.i C` and,
  /// with (data), `axpy NAME.i 1/k NAME.p` for each of its k dependencies p
  /// (the copy of NAME.p where p is on another device); its event is its
  /// last kernel. A dependency on another device is a copy of NAME.p with
  /// (data), else one with probability P, else a wait. The draws beyond the
  /// shape come from a second generator of the seed, so that the options
  /// do not change the DAG a seed draws.
  void dag_with_options(const sexp& s, std::vector<step>& out, dag_decl& dag, int dag_id,
                        const dag_shape& shape, const std::vector<int>& dev_of,
                        const std::vector<std::vector<int>>& deps_of, int64_t work,
                        int64_t window, uint64_t seed) {
    const auto& name = dag.name;
    auto tasks = static_cast<int64_t>(dev_of.size());
    std::mt19937_64 extra{seed ^ 0x9e3779b97f4a7c15ULL};
    // The faults: K distinct tasks, and for each task the faults that reach
    // it through its edges or its device's order (a failed device fails
    // what is queued on it after the fault).
    std::vector<int> fault_of(static_cast<std::size_t>(tasks), -1);
    while (static_cast<int64_t>(dag.faults.size()) < shape.faults) {
      auto t = static_cast<int>(extra() % static_cast<uint64_t>(tasks));
      if (fault_of[t] >= 0)
        continue;
      fault_of[t] = static_cast<int>(dag.faults.size());
      dag.faults.push_back(t);
    }
    dag.reached_by.assign(static_cast<std::size_t>(tasks), 0);
    std::map<int, uint64_t> device_poison;
    for (int64_t i = 0; i < tasks; ++i) {
      auto& m = dag.reached_by[i];
      m = device_poison[dev_of[i]];
      if (fault_of[i] >= 0)
        m |= uint64_t{1} << fault_of[i];
      for (auto p : deps_of[i])
        m |= dag.reached_by[p];
      device_poison[dev_of[i]] = m;
    }
    // The DAG's context on each of its devices.
    std::map<int, int> ctx_of;
    for (int d : dag.devices) {
      if (ctx_of.count(d))
        continue;
      auto st = make(s, op::make_context);
      st.device = d;
      st.ctx = static_cast<int>(prog_.contexts.size());
      prog_.contexts.push_back(fmt::format("{}@{}", name, d));
      ctx_device_.push_back(d);
      ctx_nodes_.emplace_back();
      st.text = fmt::format("(context {}@{} {})", name, d, d);
      ctx_of[d] = st.ctx;
      push(out, std::move(st));
    }
    // With faults, each device of the DAG is held until the whole DAG is
    // queued: no fault fires before every step has run, so no step is
    // refused by a device that failed already (a refused writer or event
    // would leave a task without the input that carries the failure), and
    // the tasks a fault reaches are exactly those the runtime fails.
    std::vector<int> holds;
    auto items_before = prog_.items;
    if (shape.faults > 0)
      for (auto [d, c] : ctx_of) {
        if (d >= prog_.local_devices)
          fail(s, fmt::format("(random-dag {} ... (faults K)) holds each of its devices until "
                              "the DAG is queued, and device {} is a node's, which cannot "
                              "hold: list local devices in (devices ...)",
                              name, d));
        auto h = make(s, op::hold);
        h.device = d;
        h.hold = static_cast<int>(prog_.holds.size());
        prog_.holds.push_back(fmt::format("{}@{}", name, d));
        h.text = fmt::format("(hold {} (as {}@{}))", d, name, d);
        holds.push_back(h.hold);
        push(out, std::move(h));
      }
    if (shape.data) {
      dag.expected.assign(static_cast<std::size_t>(tasks), 0.0f);
      dag.hosts.assign(static_cast<std::size_t>(tasks), -1);
    }
    std::vector<int> tnode_of;
    dag.first_tnode = static_cast<int>(prog_.tnodes.size());
    dag.window = static_cast<int>(window);
    for (int64_t i = 0; i < tasks; ++i) {
      int d = dev_of[i];
      int c = ctx_of[d];
      auto tag = [&](step& st) {
        st.dag = dag_id;
        st.dag_task = static_cast<int>(i);
      };
      int t = static_cast<int>(prog_.tnodes.size());
      prog_.tnodes.push_back(tnode{t + 1, fmt::format("{}.{}", name, i),
                                   dag_floats * sizeof(float), memory_mode::on_device});
      tnode_of.push_back(t);
      auto a = make(s, op::alloc_node);
      a.ctx = c;
      a.device = d;
      a.tnodes = {t};
      a.text = fmt::format("(alloc {}@{} {}.{})", name, d, name, i);
      ctx_nodes_[c].insert(t);
      tag(a);
      push(out, std::move(a));
      for (auto p : deps_of[i]) {
        if (dev_of[p] == d)
          continue; // the device's own order (and NAME.p is in its context)
        bool copy = shape.data || std::generate_canonical<double, 53>(extra) < shape.transfers;
        if (copy) {
          auto cp = make(s, op::copy);
          cp.ctx2 = ctx_of[dev_of[p]];
          cp.ctx = c;
          cp.device = d;
          cp.tnodes = {tnode_of[p]};
          cp.ev = dag.events[p]; // the task it copies from (check_dag_faults)
          ctx_nodes_[c].insert(tnode_of[p]);
          cp.text = fmt::format("(copy {}.{} (from {}@{}) (to {}@{}))", name, p, name, dev_of[p],
                                name, d);
          tag(cp);
          push(out, std::move(cp));
        } else {
          auto w = make(s, op::wait);
          w.device = d;
          w.ctx = c;
          w.ev = dag.events[p];
          w.text = fmt::format("(wait {}@{} {}.{})", name, d, name, p);
          tag(w);
          push(out, std::move(w));
        }
      }
      std::vector<step> kernels;
      auto kernel = [&](std::string k, std::vector<link_arg> args, std::string text) {
        auto st = make(s, op::kernel);
        st.device = d;
        st.ctx = c;
        st.kernel = std::move(k);
        st.args = std::move(args);
        st.text = std::move(text);
        tag(st);
        kernels.push_back(std::move(st));
      };
      const auto& buf = prog_.tnodes[t];
      kernel("spin_ns", {int64_t{work}},
             fmt::format("(kernel {}@{} spin_ns {})", name, d, work));
      auto value = static_cast<double>(1 + extra() % 9);
      kernel("fill", {buf, value}, fmt::format("(kernel {}@{} fill {}.{} {})", name, d, name, i,
                                              value));
      if (shape.data) {
        // As the axpy kernel computes it: y += a * x, in floats.
        float v = static_cast<float>(value);
        const auto& ds = deps_of[i];
        double share = ds.empty() ? 0 : 1.0 / static_cast<double>(ds.size());
        for (auto p : ds) {
          kernel("axpy", {buf, share, prog_.tnodes[tnode_of[p]]},
                 fmt::format("(kernel {}@{} axpy {}.{} {} {}.{})", name, d, name, i, share, name,
                             p));
          v += static_cast<float>(share) * dag.expected[p];
        }
        dag.expected[i] = v;
      }
      if (fault_of[i] >= 0)
        kernels.front().fail_with = fmt::format("random-dag {}: fault {}.{}", name, name, i);
      kernels.back().as = dag_event(s, dag, i);
      kernels.back().text.insert(kernels.back().text.size() - 1,
                                 fmt::format(" (as {}.{})", name, i));
      for (auto& k : kernels) {
        count_kernel(k);
        push(out, std::move(k));
      }
      if (shape.data && dag.reached_by[i] == 0) {
        // Read back right after the task: its device has not failed then
        // (no fault reaches the task, so none came before it on the device).
        auto h = make(s, op::to_host);
        h.ctx = c;
        h.device = d;
        h.tnodes = {t};
        h.host = static_cast<int>(prog_.hosts.size());
        prog_.hosts.push_back(host_decl{fmt::format("{}.{}", name, i), t});
        dag.hosts[i] = h.host;
        h.text = fmt::format("(to-host {}@{} {}.{})", name, d, name, i);
        tag(h);
        push(out, std::move(h));
      }
    }
    for (std::size_t d = 0; d < prog_.items.size() && !holds.empty(); ++d)
      if (prog_.items[d] - items_before[d] > prog_.queue_capacity)
        fail(s, fmt::format("(random-dag {} ... (faults K)) queues {} items on device {} while "
                            "it is held, more than its queue holds ({}, (devices N (queue-capacity C))): "
                            "give it fewer tasks or more devices",
                            name, prog_.items[d] - items_before[d], d, prog_.queue_capacity));
    for (int h : holds) {
      auto r = make(s, op::release);
      r.hold = h;
      r.text = fmt::format("(release {})", prog_.holds[h]);
      push(out, std::move(r));
    }
  }

  /// The floats of a random DAG task's buffer (`dag_with_options`).
  static constexpr std::size_t dag_floats = 16;

  void fails_pred(const sexp& p, step& st) {
    st.pred = predicate::fails;
    for (std::size_t i = 1; i < p.items().size(); ++i) {
      const auto& o = p.items()[i];
      if (!o.is_list() || o.items().empty() || !o.items()[0].is_atom())
        fail(o, "(fails ...) takes (matches RE), (origin DEVICE), (task NAME), (cancelled)");
      auto k = o.items()[0].as_atom();
      if (k == "cancelled") {
        st.cancelled = true;
        continue;
      }
      if (o.items().size() != 2)
        fail(o, fmt::format("({} ...) takes one value", k));
      const auto& v = o.items()[1];
      if (k == "matches") {
        auto re = text(v, "a regular expression", false);
        if (re.size() > max_regex)
          fail(v, fmt::format("a regular expression may have at most {} characters, this one "
                              "has {}",
                              max_regex, re.size()));
        try {
          std::regex{re, matches_syntax};
        } catch (const std::regex_error& e) {
          fail(v, fmt::format("bad regular expression '{}': {}", re, e.what()));
        }
        st.matches = re;
      } else if (k == "origin") {
        st.origin = device(v);
      } else if (k == "task") {
        st.task = text(v, "a task name", false);
      } else {
        fail(o.items()[0], fmt::format("unknown (fails ...) check '{}'; use matches, origin, "
                                       "task or cancelled", k));
      }
    }
  }

  void values_pred(const sexp& p, step& st, bool host) {
    if (!p.is_list() || p.items().size() < 2 || !p.items()[0].is_atom())
      fail(p, host ? "expected (all V), (at I V), (sum V), (values V...) or (tolerance T)"
                   : "expected (sum V), (count N) or (tolerance T)");
    auto k = p.items()[0].as_atom();
    const auto& v = p.items()[1];
    if (k == "tolerance")
      st.tolerance = real(v, "a tolerance");
    else if (k == "sum")
      st.sum = real(v, "a sum");
    else if (k == "count" && !host)
      st.count = integer(v, "a count");
    else if (k == "all" && host)
      st.all = real(v, "a value");
    else if (k == "at" && host) {
      if (p.items().size() != 3)
        fail(p, "(at INDEX VALUE)");
      st.at = std::pair{integer(v, "an index"), real(p.items()[2], "a value")};
    } else if (k == "values" && host) {
      std::vector<float> xs;
      for (std::size_t i = 1; i < p.items().size(); ++i)
        xs.push_back(static_cast<float>(real(p.items()[i], "a value")));
      st.expect_values = std::move(xs);
    } else {
      fail(p.items()[0], fmt::format("unknown check '{}' for ({} ...)", k,
                                     host ? "host" : "checksum"));
    }
    if (p.items().size() > 2 && k != "at" && k != "values")
      fail(p, fmt::format("({} ...) takes one value", k));
  }

  /// An item of a time assertion: an event, or a hold (its `hold` task).
  void timed_item(const sexp& s, int& ev, int& hold) const {
    auto n = text(s, "an event or a hold");
    auto it = find_name(n);
    if (!it)
      fail(s, fmt::format("unknown event or hold '{}'", n));
    if (it->kind == sym::hold)
      hold = it->id;
    else
      ev = event(s);
  }

  /// A time in whole nanoseconds (`5ms`; a plain number is milliseconds).
  int64_t nanoseconds(const sexp& s, const char* what) const {
    auto ms = milliseconds(s, what);
    if (ms < 0 || ms > 86'400'000)
      fail(s, fmt::format("{} must be 0 to 86400 s, got {} ms", what, ms));
    return std::llround(ms * 1e6);
  }

  /// `(at-least T)` or `(at-most T)` of `(after A B ...)`.
  void time_bound(const sexp& b, step& st) const {
    if (!b.is_list() || b.items().size() != 2 || !b.items()[0].is_atom()
        || (b.items()[0].as_atom() != "at-least" && b.items()[0].as_atom() != "at-most"))
      fail(b, "expected (at-least T) or (at-most T), e.g. (at-least 2ms)");
    bool least = b.items()[0].as_atom() == "at-least";
    auto& slot = least ? st.at_least : st.at_most;
    if (slot)
      fail(b, fmt::format("({} ...) is given twice", b.items()[0].as_atom()));
    slot = nanoseconds(b.items()[1], least ? "the time of (at-least T)" : "the time of (at-most T)");
    if (st.at_least && st.at_most && *st.at_least > *st.at_most)
      fail(b, "(at-least T) is above (at-most T)");
  }

  /// `true` or `false`, the predicate of `(idle D)` and `(resolved EV)`.
  predicate true_or_false(const sexp& s) const {
    auto b = text(s, "true or false");
    if (b != "true" && b != "false")
      fail(s, fmt::format("expected true or false, got '{}'", b));
    return b == "true" ? predicate::is_true : predicate::is_false;
  }

  void expect_form(const sexp& s, std::vector<step>& out) {
    const auto& xs = s.items();
    if (xs.size() < 2 || !xs[1].is_list() || xs[1].items().empty() || !xs[1].items()[0].is_atom())
      fail(s, "(expect SUBJECT ...) needs a subject, e.g. (expect (sync e) ok)");
    const auto& subj = xs[1];
    auto head = subj.items()[0].as_atom();
    auto st = make(s, op::expect);
    auto args = [&](std::size_t n, const char* usage) {
      if (subj.items().size() != n + 1)
        fail(subj, fmt::format("({} ...) takes {} argument(s): {}", head, n, usage));
    };
    auto preds = [&](std::size_t lo, std::size_t hi) {
      if (xs.size() - 2 < lo || xs.size() - 2 > hi)
        fail(s, fmt::format("(expect ({} ...) ...) takes {} predicate(s)", head,
                            lo == hi ? std::to_string(lo) : fmt::format("{} to {}", lo, hi)));
    };
    if (head == "state") {
      args(1, "(state EVENT)");
      preds(1, 1);
      st.what = subject::state;
      st.pred = predicate::state_is;
      st.ev = event(subj.items()[1]);
      st.state = text(xs[2], "a state");
      if (st.state != "done" && st.state != "failed" && st.state != "cancelled"
          && st.state != "pending")
        fail(xs[2], fmt::format("unknown state '{}'; one of done, failed, cancelled, pending",
                                st.state));
    } else if (head == "before") {
      args(2, "(before A B): A finished before B started");
      preds(0, 0);
      st.what = subject::before;
      st.pred = predicate::before;
      st.ev = event(subj.items()[1]);
      st.ev2 = event(subj.items()[2]);
    } else if (head == "resolved") {
      args(1, "(resolved EVENT)");
      preds(0, 1);
      st.what = subject::resolved;
      st.ev = event(subj.items()[1]);
      st.pred = xs.size() == 3 ? true_or_false(xs[2]) : predicate::is_true;
    } else if (head == "overlap") {
      args(2, "(overlap A B): the slices of A and B intersect");
      preds(0, 0);
      st.what = subject::overlap;
      timed_item(subj.items()[1], st.ev, st.hold);
      timed_item(subj.items()[2], st.ev2, st.hold2);
    } else if (head == "after") {
      if (subj.items().size() < 3 || subj.items().size() > 5)
        fail(subj, "(after A B [(at-least T)] [(at-most T)]): A started no earlier than B "
                   "ended (plus T)");
      preds(0, 0);
      st.what = subject::after;
      timed_item(subj.items()[1], st.ev, st.hold);
      timed_item(subj.items()[2], st.ev2, st.hold2);
      for (std::size_t i = 3; i < subj.items().size(); ++i)
        time_bound(subj.items()[i], st);
    } else if (head == "within") {
      args(2, "(within EVENT T): EVENT resolved at most T after the step that makes it began");
      preds(0, 0);
      st.what = subject::within;
      st.ev = event(subj.items()[1]);
      if (auto l = locate_event(prog_.families, st.ev); l.family >= 0)
        prog_.timed_family.insert(st.ev);
      else
        prog_.events[l.decl].timed = true;
      st.at_most = nanoseconds(subj.items()[2], "the time of (within EVENT T)");
    } else if (head == "concurrency") {
      if (subj.items().size() < 3 || subj.items().size() > 4)
        fail(subj, "(concurrency DEVICES N), (concurrency DEVICES (at-most N)) or (at-least "
                   "N): DEVICES a list such as (0 1 2), or all");
      preds(0, 0);
      st.what = subject::concurrency;
      const auto& ds = subj.items()[1];
      if (ds.is_atom() && text(ds, "devices") == "all") {
        for (int d = 0; d < prog_.devices; ++d)
          st.devs.push_back(d);
      } else {
        if (!ds.is_list() || ds.items().empty())
          fail(ds, "expected the devices as a list, e.g. (0 1 2), or all");
        for (const auto& d : ds.items()) {
          int x = device(d);
          if (std::find(st.devs.begin(), st.devs.end(), x) != st.devs.end())
            fail(d, fmt::format("device {} is listed twice", x));
          st.devs.push_back(x);
        }
      }
      auto count = [&](const sexp& n) {
        auto v = integer(n, "a number of devices");
        if (v < 0 || v > static_cast<int64_t>(st.devs.size()))
          fail(n, fmt::format("a number of devices busy at once must be 0 to {} (the devices "
                              "listed), got {}",
                              st.devs.size(), v));
        return v;
      };
      for (std::size_t i = 2; i < subj.items().size(); ++i) {
        const auto& b = subj.items()[i];
        if (b.is_list() && b.items().size() == 2 && b.items()[0].is_atom()
            && (b.items()[0].as_atom() == "at-least" || b.items()[0].as_atom() == "at-most")) {
          (b.items()[0].as_atom() == "at-least" ? st.at_least : st.at_most) =
            count(b.items()[1]);
        } else if (subj.items().size() == 3
                   && !(b.is_list() && !b.items().empty() && b.items()[0].is_atom()
                        && std::string_view{"+-*/mod"}.find(b.items()[0].as_atom())
                             == std::string_view::npos)) {
          st.at_least = st.at_most = count(b); // exactly N at most
        } else {
          fail(b, "expected (at-least N) or (at-most N)");
        }
      }
      if (st.at_least && st.at_most && *st.at_least > *st.at_most)
        fail(subj, fmt::format("(at-least {}) is above (at-most {})", *st.at_least,
                               *st.at_most));
    } else if (head == "idle") {
      args(1, "(idle DEVICE)");
      preds(0, 1);
      st.what = subject::idle;
      st.device = device(subj.items()[1]);
      st.pred = xs.size() == 3 ? true_or_false(xs[2]) : predicate::is_true;
    } else if (head == "memory") {
      args(1, "(memory DEVICE)");
      preds(1, 1);
      st.what = subject::memory;
      st.pred = predicate::compare;
      st.device = device(subj.items()[1]);
      const auto& p = xs[2];
      if (!p.is_list() || p.items().size() != 2 || !p.items()[0].is_atom())
        fail(p, "expected a comparison: (= N), (<= N), (>= N), (< N) or (> N)");
      st.cmp = p.items()[0].as_atom();
      if (st.cmp != "=" && st.cmp != "<=" && st.cmp != ">=" && st.cmp != "<" && st.cmp != ">")
        fail(p.items()[0], fmt::format("unknown comparison '{}'", st.cmp));
      st.number = integer(p.items()[1], "a number of bytes");
    } else if ((head == "checksum" && subj.items().size() == 2) || head == "host") {
      args(1, head == "host" ? "(host HOST)" : "(checksum NAME)");
      preds(1, 5);
      bool host = head == "host";
      st.what = host ? subject::host : subject::checksum;
      st.pred = predicate::values;
      if (host) {
        st.host = lookup(subj.items()[1], sym::host).id;
      } else {
        st.ev = event(subj.items()[1]);
        if (!checksums_.count(st.ev))
          fail(subj.items()[1], fmt::format("'{}' is an event, not the name of a (checksum ...)",
                                            prog_.event_name(st.ev)));
      }
      for (std::size_t i = 2; i < xs.size(); ++i)
        values_pred(xs[i], st, host);
      if (!st.sum && !st.count && !st.all && !st.at && !st.expect_values)
        fail(s, "nothing to check: give (sum V)" + std::string{host ? ", (all V), (at I V) or (values ...)" : " or (count N)"});
    } else {
      // An action: the step must succeed (ok) or fail as described.
      static const std::set<std::string> actions = {
        "sync", "await", "sync-device", "kernel", "checksum", "wait", "memset", "pool",
        "free-pool", "from-host", "to-host", "copy", "alloc", "cancel", "recover", "delay"};
      if (!actions.count(head))
        fail(subj.items()[0], fmt::format("unknown subject '{}' for expect; one of state, "
                                          "resolved, before, overlap, after, within, concurrency, idle, "
                                          "memory, checksum, host, or an "
                                          "action (sync, await, kernel, ...)",
                                          head));
      preds(0, 1);
      std::vector<step> inner;
      statement(subj, inner);
      current_ = &s;
      if (inner.size() != 1)
        fail(subj, "an expected action must be a single step");
      st.what = subject::action;
      st.action = std::make_shared<step>(std::move(inner.front()));
      st.device = st.action->device;
      st.pred = predicate::ok;
      if (xs.size() == 3) {
        const auto& p = xs[2];
        if (p.is_atom() && text(p, "ok") == "ok")
          st.pred = predicate::ok;
        else if (p.is_list() && !p.items().empty() && p.items()[0].is_atom()
                 && p.items()[0].as_atom() == "fails")
          fails_pred(p, st);
        else
          fail(p, "expected ok or (fails ...)");
      }
      total_steps_--; // counted as part of the expect
    }
    push(out, std::move(st));
  }

  program prog_;
  /// `--param NAME=VALUE`, and the names a `(param ...)` read.
  std::map<std::string, std::string> params_;
  std::set<std::string> param_names_;
  /// The file whose forms are being read: the script's, or an included one.
  std::string file_;
  /// The includes being read, outermost first: (canonical path, as written).
  std::vector<std::pair<std::string, std::string>> including_;
  /// Each included file's forms, parsed once, kept for the load (steps and
  /// forward references point into them).
  std::map<std::string, std::vector<sexp>> included_;
  std::optional<uint64_t> seed_override_;
  std::optional<uint64_t> script_seed_;
  std::map<std::string, symbol> names_;
  /// The names of families' events: `prefix`, a whole number t below
  /// `times` as `std::to_string` writes it, `suffix`; the event of
  /// iteration t is `first + t * stride`.
  struct name_pattern {
    std::string prefix, suffix;
    int first = 0;
    int stride = 1;
    uint64_t times = 0;
    location where;

    std::optional<int> match(const std::string& n) const {
      if (n.size() <= prefix.size() + suffix.size() || n.compare(0, prefix.size(), prefix) != 0
          || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0)
        return std::nullopt;
      std::string_view d{n.data() + prefix.size(), n.size() - prefix.size() - suffix.size()};
      if (d.size() > 1 && d[0] == '0')
        return std::nullopt;
      uint64_t t = 0;
      auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), t);
      if (ec != std::errc{} || end != d.data() + d.size() || t >= times)
        return std::nullopt;
      return first + static_cast<int>(t) * stride;
    }
  };
  std::vector<name_pattern> patterns_;
  /// The patterns by `pattern_key`, and each shape's run of the number.
  std::unordered_map<std::string, std::size_t> pattern_keys_;
  std::map<std::string, std::size_t> pattern_shapes_;
  /// A (sync-in ...) whose event was not declared yet: the step (by index,
  /// in the list it went to) and the form naming the event.
  struct forward_event {
    const sexp* form;
    std::string name;
    std::size_t index;
    std::vector<step>* steps;
    location where;
  };
  std::vector<forward_event> forward_events_;
  std::vector<aimed_fault> aimed_;
  std::map<std::string, int64_t> vars_;
  std::vector<int> ctx_device_;
  std::vector<std::set<int>> ctx_nodes_;
  std::vector<uint64_t> kernels_on_;
  std::map<int, std::map<uint64_t, std::pair<std::string, location>>> pending_faults_;
  std::set<int> checksums_;
  /// The `(round ...)` being read (an index into `program::rounds`), -1
  /// outside one, and the items per device its body makes.
  int in_round_ = -1;
  std::vector<uint64_t> round_items_;
  std::size_t total_steps_ = 0;
  std::size_t expanded_ = 0;
  const sexp* current_ = nullptr;
};

} // namespace

std::shared_ptr<const program> load(std::string_view text, const std::string& file,
                                    std::optional<uint64_t> seed,
                                    const std::map<std::string, std::string>& params) {
  loader l{file, seed, params};
  return l.load(text);
}

std::shared_ptr<const program> load_file(const std::string& path, std::optional<uint64_t> seed,
                                         const std::map<std::string, std::string>& params) {
  std::ifstream in{path, std::ios::binary};
  if (!in)
    throw script_error(location{path, 0, 0}, "cannot read the file");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad())
    throw script_error(location{path, 0, 0}, "cannot read the file");
  return load(buf.str(), path, seed, params);
}

} // namespace multidev::scenario
