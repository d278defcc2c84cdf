#include "multidev/sexp.hpp"

#include <fmt/format.h>

namespace multidev {

const std::string& sexp::as_atom() const {
  if (!is_atom_)
    throw std::logic_error("sexp: expected an atom, got a list " + to_string());
  return atom_;
}

const std::vector<sexp>& sexp::items() const {
  if (is_atom_)
    throw std::logic_error("sexp: expected a list, got the atom " + to_string());
  return items_;
}

sexp& sexp::push_back(sexp x) {
  if (is_atom_)
    throw std::logic_error("sexp: cannot append to the atom " + to_string());
  items_.push_back(std::move(x));
  return *this;
}

const sexp* sexp::find(std::string_view key) const {
  if (is_atom_)
    return nullptr;
  for (const auto& x : items_)
    if (x.is_list() && !x.items_.empty() && x.items_[0].is_atom()
        && x.items_[0].atom_ == key)
      return &x;
  return nullptr;
}

namespace {

bool needs_quotes(const std::string& s) {
  if (s.empty())
    return true;
  for (char c : s)
    if (c == '(' || c == ')' || c == '"' || c == ';' || c == '\\'
        || static_cast<unsigned char>(c) <= ' ')
      return true;
  return false;
}

void print(const sexp& x, std::string& out) {
  if (x.is_atom()) {
    const auto& a = x.as_atom();
    if (!needs_quotes(a)) {
      out += a;
      return;
    }
    out += '"';
    for (char c : a) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        default: out += c;
      }
    }
    out += '"';
    return;
  }
  out += '(';
  bool first = true;
  for (const auto& y : x.items()) {
    if (!first)
      out += ' ';
    first = false;
    print(y, out);
  }
  out += ')';
}

class parser {
public:
  explicit parser(std::string_view text) : text_(text) {}

  bool at_end() {
    skip_space();
    return pos_ >= text_.size();
  }

  sexp next() {
    skip_space();
    if (pos_ >= text_.size())
      fail("unexpected end of input, expected an s-expression");
    int l = line_, c = col_;
    char ch = text_[pos_];
    sexp result;
    if (ch == '(') {
      // Nesting is bounded so that no input can exhaust the stack (of the
      // parser, or of a printer or destructor walking the result).
      if (depth_ >= max_depth)
        fail(fmt::format("lists nested deeper than {} levels", max_depth));
      ++depth_;
      advance();
      result = sexp::list();
      for (;;) {
        skip_space();
        if (pos_ >= text_.size())
          throw sexp_parse_error(l, c, "unclosed '(' (end of input reached)");
        if (text_[pos_] == ')') {
          advance();
          --depth_;
          break;
        }
        result.push_back(next());
      }
    } else if (ch == ')') {
      fail("unexpected ')'");
    } else if (ch == '"') {
      advance();
      std::string s;
      for (;;) {
        if (pos_ >= text_.size())
          throw sexp_parse_error(l, c, "unterminated string");
        char d = text_[pos_];
        advance();
        if (d == '"')
          break;
        if (d == '\\') {
          if (pos_ >= text_.size())
            throw sexp_parse_error(l, c, "unterminated string");
          char e = text_[pos_];
          advance();
          switch (e) {
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case '"': s += '"'; break;
            case '\\': s += '\\'; break;
            default: fail(fmt::format("unknown escape '\\{}' in string", e));
          }
          continue;
        }
        s += d;
      }
      result = sexp::atom(std::move(s));
    } else {
      std::string s;
      while (pos_ < text_.size()) {
        char d = text_[pos_];
        if (d == '(' || d == ')' || d == '"' || d == ';'
            || static_cast<unsigned char>(d) <= ' ')
          break;
        s += d;
        advance();
      }
      result = sexp::atom(std::move(s));
    }
    result.line = l;
    result.column = c;
    return result;
  }

  [[noreturn]] void fail(const std::string& msg) {
    throw sexp_parse_error(line_, col_, msg);
  }

private:
  void advance() {
    if (text_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }

  void skip_space() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == ';') {
        while (pos_ < text_.size() && text_[pos_] != '\n')
          advance();
      } else if (static_cast<unsigned char>(c) <= ' ') {
        advance();
      } else {
        break;
      }
    }
  }

  static constexpr int max_depth = 1000;

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  int line_ = 1;
  int col_ = 1;
};

} // namespace

std::string sexp::to_string() const {
  std::string out;
  print(*this, out);
  return out;
}

sexp_parse_error::sexp_parse_error(int line, int column,
                                   const std::string& message)
  : std::runtime_error(fmt::format("{}:{}: {}", line, column, message)),
    line_(line),
    column_(column),
    message_(message) {
}

sexp parse_sexp(std::string_view text) {
  parser p{text};
  auto result = p.next();
  if (!p.at_end())
    p.fail("unexpected text after the s-expression");
  return result;
}

std::vector<sexp> parse_sexps(std::string_view text) {
  parser p{text};
  std::vector<sexp> result;
  while (!p.at_end())
    result.push_back(p.next());
  return result;
}

} // namespace multidev
