#pragma once
/// \file
/// S-expressions: the value type every multidev type prints itself to
/// (`to_sexp`), the form of debug info and `static_properties`, and the syntax
/// of scenario scripts. Plain data, no CAF.

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace multidev {

/// An atom or a list of s-expressions. Atoms that need it are printed quoted,
/// so `parse(x.to_string()) == x` for every value.
class sexp {
public:
  /// An empty list.
  sexp() = default;

  /// An atom.
  static sexp atom(std::string text) {
    sexp s;
    s.is_atom_ = true;
    s.atom_ = std::move(text);
    return s;
  }

  /// A list of the given elements.
  static sexp list(std::vector<sexp> items = {}) {
    sexp s;
    s.items_ = std::move(items);
    return s;
  }

  /// `(key value)` where `value` is an atom.
  static sexp field(std::string key, std::string value) {
    return list({atom(std::move(key)), atom(std::move(value))});
  }

  /// `(key value)`.
  static sexp field(std::string key, sexp value) {
    return list({atom(std::move(key)), std::move(value)});
  }

  /// Whether this is an atom.
  bool is_atom() const noexcept { return is_atom_; }
  /// Whether this is a list.
  bool is_list() const noexcept { return !is_atom_; }

  /// The atom's text; throws `std::logic_error` on a list.
  const std::string& as_atom() const;

  /// The list's elements; throws `std::logic_error` on an atom.
  const std::vector<sexp>& items() const;

  /// Appends to a list; throws `std::logic_error` on an atom.
  sexp& push_back(sexp x);

  /// For a list of `(key value...)` lists: the first one whose head is `key`,
  /// or nullptr.
  const sexp* find(std::string_view key) const;

  /// The printed form: atoms bare when they can be, quoted otherwise.
  std::string to_string() const;

  /// Structural equality; source positions are ignored.
  friend bool operator==(const sexp& x, const sexp& y) {
    return x.is_atom_ == y.is_atom_ && x.atom_ == y.atom_
           && x.items_ == y.items_;
  }

  /// Where a parsed value started (1-based); 0 when not parsed.
  int line = 0;
  /// The column where a parsed value started (1-based); 0 when not parsed.
  int column = 0;

private:
  bool is_atom_ = false;
  std::string atom_;
  std::vector<sexp> items_;
};

/// Thrown by `parse_sexp`: what was wrong and where (`line:column: message`).
class sexp_parse_error : public std::runtime_error {
public:
  /// `what()` is `line:column: message`.
  sexp_parse_error(int line, int column, const std::string& message);
  /// The line of the error (1-based).
  int line() const noexcept { return line_; }
  /// The column of the error (1-based).
  int column() const noexcept { return column_; }
  /// The message without the position.
  const std::string& message() const noexcept { return message_; }

private:
  int line_;
  int column_;
  std::string message_;
};

/// Parses exactly one s-expression (comments start with `;`). Lists nest at
/// most 1000 deep; deeper input is a parse error, never a stack overflow.
sexp parse_sexp(std::string_view text);

/// Parses a sequence of s-expressions, e.g. a whole scenario file.
std::vector<sexp> parse_sexps(std::string_view text);

} // namespace multidev
