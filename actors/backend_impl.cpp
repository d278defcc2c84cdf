// The state behind `backend`: which devices and actors it owns, the one
// blocking request it makes (flush), and shutdown.
#include "actors/backend_impl.hpp"

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>

#include "actors/logger_tie.hpp"

namespace multidev::detail {

namespace {
constexpr auto request_timeout = std::chrono::minutes(5);
} // namespace

device_record& record_of(const device& d) {
  if (!d.record())
    throw std::invalid_argument("empty device handle (default-constructed device)");
  return *d.record();
}

device_core& backend_impl::core_of(const device& d) const {
  auto& rec = record_of(d);
  std::lock_guard guard{mu};
  if (!actor_of.contains(rec.r.core().get()))
    throw std::invalid_argument(
      fmt::format("device {} does not belong to this backend", rec.name));
  return rec.core();
}

device_actor backend_impl::actor_for(const device& d) const {
  auto& rec = record_of(d);
  std::lock_guard guard{mu};
  auto i = actor_of.find(rec.r.core().get());
  if (i == actor_of.end())
    throw std::invalid_argument(
      fmt::format("device {} does not belong to this backend", rec.name));
  return i->second;
}

void backend_impl::flush(const device& d) const {
  if (current_runner != nullptr)
    throw deadlock_error(fmt::format(
      "flush({}) from a task: the round trip may wait behind a full queue that "
      "only this runner drains",
      record_of(d).name));
  auto a = actor_for(d);
  logger_tie_guard untie;
  caf::scoped_actor self{*sys};
  caf::error err;
  bool replied = false;
  self->request(a, request_timeout, atoms::all_work_atom::value)
    .receive([&](uint64_t) { replied = true; }, [&](caf::error& e) { err = e; });
  if (err || !replied)
    throw_error(err, record_of(d).name);
}

void backend_impl::shutdown() {
  std::vector<device> all;
  std::vector<device_actor> handles;
  {
    std::lock_guard guard{mu};
    all = made;
    for (auto& [core, a] : actor_of)
      handles.push_back(a);
    actor_of.clear();
  }
  // Finish accepted work first (waits between devices resolve through the
  // cores), then stop the actors. Every core stops accepting before any is
  // joined: a runner finishing its queue may be waiting on another device.
  if (opts.on_destroy == backend_options::destroy_policy::cancel)
    for (auto& d : all)
      d.get_runner().core()->cancel("cancelled: the backend was destroyed");
  for (auto& d : all)
    d.get_runner().core()->request_stop();
  for (auto& d : all) // every device stops: cut what leaves the backend
    d.get_runner().core()->cancel_unanswerable_waits();
  for (auto& d : all)
    d.get_runner().core()->shutdown();
  for (auto& a : handles)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  handles.clear();
}

} // namespace multidev::detail
