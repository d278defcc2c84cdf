#include "multidev/trace.hpp"

#include <array>

namespace multidev {

namespace {
constexpr std::array<const char*, 6> trace_kind_names = {"task", "copy", "memset",
                                                         "pool", "gate", "cancel"};
} // namespace

std::string to_string(trace_kind k) {
  return trace_kind_names[static_cast<size_t>(k)];
}

std::optional<trace_kind> trace_kind_from_string(const std::string& s) {
  for (size_t i = 0; i < trace_kind_names.size(); ++i)
    if (s == trace_kind_names[i])
      return static_cast<trace_kind>(i);
  return std::nullopt;
}

sexp to_sexp(trace_kind k) {
  return sexp::atom(to_string(k));
}

sexp to_sexp(const trace_record& r) {
  auto s = sexp::list({sexp::atom("item"), sexp::field("seq", std::to_string(r.seq)),
                       sexp::field("kind", to_sexp(r.kind)),
                       sexp::field("description", r.description),
                       sexp::field("start_ns", std::to_string(r.start_ns)),
                       sexp::field("end_ns", std::to_string(r.end_ns))});
  if (r.failed)
    s.push_back(sexp::field("failed", "true"));
  if (r.kind == trace_kind::gate)
    s.push_back(sexp::list({sexp::atom("awaits"), sexp::field("device", r.awaited_device),
                            sexp::field("seq", std::to_string(r.awaited_seq))}));
  return s;
}

std::string to_string(host_span_kind k) {
  return k == host_span_kind::wait ? "wait" : "node_lost";
}

sexp to_sexp(const host_span& h) {
  auto s = sexp::list({sexp::atom("host_span"), sexp::field("kind", to_string(h.kind)),
                       sexp::field("description", h.description),
                       sexp::field("thread", std::to_string(h.thread)),
                       sexp::field("seq", std::to_string(h.seq)),
                       sexp::field("start_ns", std::to_string(h.start_ns)),
                       sexp::field("end_ns", std::to_string(h.end_ns))});
  if (h.failed)
    s.push_back(sexp::field("failed", "true"));
  return s;
}

sexp to_sexp(const device_trace& t) {
  auto records = sexp::list({sexp::atom("records")});
  for (const auto& r : t.records)
    records.push_back(to_sexp(r));
  auto s = sexp::list({sexp::atom("trace"), sexp::field("device", t.device),
                       sexp::field("capacity", std::to_string(t.capacity)),
                       sexp::field("dropped", std::to_string(t.dropped)), records});
  if (!t.host.empty()) {
    auto host = sexp::list({sexp::atom("host")});
    for (const auto& h : t.host)
      host.push_back(to_sexp(h));
    s.push_back(std::move(host));
  }
  if (!t.unreachable.empty())
    s.push_back(sexp::field("unreachable", t.unreachable));
  return s;
}

} // namespace multidev
