#include "multidev/task.hpp"

#include <fmt/format.h>

namespace multidev {

std::string kind_name(const kernel_arg& a) {
  switch (a.index()) {
    case 1: return "int";
    case 2: return "float";
    case 3: return "string";
    case 4: return "buffer";
    default: return "none";
  }
}

sexp to_sexp(const kernel_arg& a) {
  switch (a.index()) {
    case 1: return sexp::atom(std::to_string(std::get<int64_t>(a)));
    case 2: return sexp::atom(fmt::format("{}", std::get<double>(a)));
    case 3: return sexp::atom(std::get<std::string>(a));
    case 4: {
      const auto& b = std::get<buffer_arg>(a);
      return sexp::list({sexp::atom("buffer"),
                         sexp::field("pool", std::to_string(b.loc.pool_id)),
                         sexp::field("offset", std::to_string(b.loc.offset)),
                         sexp::field("size", std::to_string(b.size_in_bytes))});
    }
    default: return sexp::atom("none");
  }
}

sexp to_sexp(const task_spec& t) {
  auto result = sexp::list({sexp::atom(t.kernel)});
  for (const auto& a : t.args)
    result.push_back(to_sexp(a));
  return result;
}

sexp to_sexp(const task& t) {
  return sexp::list({sexp::atom("task"), sexp::field("description", t.description),
                     sexp::field("keeps_alive", t.keep_alive ? "true" : "false")});
}

} // namespace multidev
