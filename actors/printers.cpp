// `to_sexp` for the public handles and records (OCANNL's `sexp_of_*`).
#include "multidev/backend.hpp"

#include <fmt/format.h>

#include <mutex>
#include <ostream>

#include "actors/backend_impl.hpp"
#include "actors/endpoint.hpp"

namespace multidev {

using detail::record_of;

sexp to_sexp(const dev& d) {
  return sexp::list({sexp::atom("dev"), sexp::field("driver", d.driver),
                     sexp::field("ordinal", std::to_string(d.ordinal))});
}

sexp to_sexp(const runner& r) {
  if (!r.endpoint())
    return sexp::list({sexp::atom("runner"), sexp::atom("none")});
  if (!r.is_local()) // printing makes no round trip
    return sexp::list({sexp::atom("runner"), sexp::field("device", r.endpoint()->name()),
                       sexp::field("node", r.key().node.str())});
  return sexp::list({sexp::atom("runner"), sexp::field("device", r.endpoint()->name()),
                     sexp::field("queue_length", std::to_string(r.queue_length()))});
}

std::ostream& operator<<(std::ostream& os, node_ref n) {
  return os << (n.empty() ? std::string_view{"none"} : std::string_view{n.str()});
}

sexp to_sexp(const device_key& k) {
  return sexp::list({sexp::atom("device_key"),
                     sexp::field("node", k.node.empty() ? "none" : k.node.str()),
                     sexp::field("device_id", std::to_string(k.device_id))});
}

std::ostream& operator<<(std::ostream& os, const device_key& k) {
  return os << to_sexp(k).to_string();
}

sexp to_sexp(const event& e) {
  std::string state;
  auto ep = e.endpoint();
  if (e.key() == device_key{})
    state = "done";
  else if (!ep)
    state = "unknown";
  else if (ep->core())
    state = e.is_done() ? "done" : e.is_failed() ? "failed" : "pending";
  else // another process's device: what is known here, without a round trip
    state = ep->known_done(e.seq()) ? "done" : "unknown";
  return sexp::list({sexp::atom("event"),
                     sexp::field("device", e.key() == device_key{} ? "none" : e.device_name()),
                     sexp::field("node", e.key().node.empty() ? "none" : e.key().node.str()),
                     sexp::field("device_id", std::to_string(e.key().device_id)),
                     sexp::field("seq", std::to_string(e.seq())),
                     sexp::field("state", state)});
}

std::ostream& operator<<(std::ostream& os, const event& e) {
  return os << to_sexp(e).to_string();
}

sexp to_sexp(const buffer_ptr& p) {
  return sexp::atom(fmt::format("{}", static_cast<const void*>(p)));
}

sexp to_sexp(const device& d) {
  if (!d)
    return sexp::list({sexp::atom("device"), sexp::atom("none")});
  auto& rec = record_of(d);
  std::lock_guard guard{rec.mu};
  auto writers = sexp::list({sexp::atom("updating_for")});
  for (const auto& [t, e] : rec.updating_for)
    writers.push_back(sexp::list({sexp::atom(t.label), to_sexp(e)}));
  auto cache = sexp::list({sexp::atom("constant_buffer_cache")});
  for (const auto& [t, loc] : rec.constant_buffer_cache)
    cache.push_back(sexp::list({sexp::atom(t.label), to_sexp(loc)}));
  return sexp::list(
    {sexp::atom("device"), sexp::field("name", rec.name), to_sexp(rec.dv), to_sexp(rec.r.key()),
     sexp::field("ordinal", std::to_string(rec.ordinal)),
     sexp::field("device_id", std::to_string(rec.device_id)), to_sexp(rec.r),
     sexp::field("merge_buffer_capacity", std::to_string(rec.merge_buffer_capacity)),
     sexp::field("updating_for_merge_buffer",
                 rec.updating_for_merge_buffer
                   ? sexp::list({sexp::atom(rec.updating_for_merge_buffer->first.label),
                                 to_sexp(rec.updating_for_merge_buffer->second)})
                   : sexp::atom("none")),
     writers, cache, sexp::field("next_pool_id", std::to_string(rec.next_pool_id))});
}

sexp to_sexp(const context& c) {
  return sexp::list(
    {sexp::atom("context"), sexp::field("device", c.device ? c.device.name() : "none"),
     sexp::field("parent", c.parent ? "some" : "none"), to_sexp(c.buffers),
     sexp::field("finalized", c.finalized ? "true" : "false"), to_sexp(c.optimize),
     sexp::field("merge_buffer_node",
                 c.merge_buffer_node ? to_sexp(*c.merge_buffer_node) : sexp::atom("none"))});
}

sexp to_sexp(const routine& r) {
  auto labels = [](const char* key, const std::set<tnode>& nodes) {
    auto l = sexp::list({sexp::atom(key)});
    for (const auto& t : nodes)
      l.push_back(sexp::atom(t.label));
    return l;
  };
  return sexp::list(
    {sexp::atom("routine"), sexp::field("name", r.name), to_sexp(r.context),
     labels("inputs", r.inputs), labels("outputs", r.outputs),
     sexp::field("merge_buffer_input",
                 r.merge_buffer_input ? to_sexp(*r.merge_buffer_input) : sexp::atom("none"))});
}

} // namespace multidev
