// libFuzzer harness for the s-expression parser (include/multidev/sexp.hpp).
//
// Expected: a value, or sexp_parse_error. A finding: a crash, a sanitizer
// report, any other exception escaping, or a broken promise of the header:
//   - parse_sexp(v.to_string()) == v for every parsed value v (and for an
//     atom made of the input's bytes, so printing is checked on any text);
//   - parse_sexp(text) succeeds exactly when parse_sexps(text) gives one
//     value, and then gives that value;
//   - an error's position is at or after 1:1.
// Build and run: scripts/run-fuzz.sh (fuzz/CMakeLists.txt).
#include <multidev/sexp.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

using multidev::parse_sexp;
using multidev::parse_sexps;
using multidev::sexp;
using multidev::sexp_parse_error;

namespace {

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_sexp: %s\n  %s\n", what, detail.c_str());
  std::abort();
}

void check_position(const sexp_parse_error& e) {
  if (e.line() < 1 || e.column() < 1)
    broken("a parse error points before 1:1", e.what());
}

/// The printed form of `v` parses back to `v`.
void round_trips(const sexp& v) {
  auto text = v.to_string();
  std::optional<sexp> back;
  try {
    back = parse_sexp(text);
  } catch (const sexp_parse_error& e) {
    broken("the printed form of a value does not parse", std::string{e.what()} + " in " + text);
  }
  if (!(*back == v))
    broken("parse_sexp(v.to_string()) != v", text + " reparsed as " + back->to_string());
  if (back->to_string() != text)
    broken("printing is not stable", text + " then " + back->to_string());
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text{reinterpret_cast<const char*>(data), size};

  std::optional<std::vector<sexp>> all;
  try {
    all = parse_sexps(text);
  } catch (const sexp_parse_error& e) {
    check_position(e);
  }
  if (all)
    for (const auto& v : *all)
      round_trips(v);

  std::optional<sexp> one;
  try {
    one = parse_sexp(text);
  } catch (const sexp_parse_error& e) {
    check_position(e);
  }
  if (one) {
    round_trips(*one);
    if (!all || all->size() != 1 || !((*all)[0] == *one))
      broken("parse_sexp and parse_sexps disagree", one->to_string());
  } else if (all && all->size() == 1) {
    broken("parse_sexps gives one value but parse_sexp refuses the text",
           (*all)[0].to_string());
  }

  // Any bytes as an atom: printed (quoted where needed), it reads back.
  round_trips(sexp::atom(std::string{text}));
  return 0;
}
