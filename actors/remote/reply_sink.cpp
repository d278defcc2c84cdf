#include "actors/remote/reply_sink.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_companion.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message_id.hpp>
#include <caf/scoped_execution_unit.hpp>

#include <vector>

#include "actors/logger_tie.hpp"
#include "messages/tsan.hpp"
#include "multidev/protocol.hpp"

namespace multidev::detail {

namespace {

caf::actor_companion* companion_of(const caf::strong_actor_ptr& p) {
  return static_cast<caf::actor_companion*>(caf::actor_cast<caf::abstract_actor*>(p));
}

/// How many sink callbacks this thread is inside: CAF runs a companion's
/// enqueue handler under the companion's lock, which ending the companion
/// takes too.
thread_local int inside_sink_callback = 0;

/// The companions' enqueue handlers are made on one thread and run on CAF's
/// (the I/O thread, a worker), handed over inside Debian's uninstrumented
/// libcaf_core: one ThreadSanitizer key for all of them (messages/tsan.hpp).
const char handler_key = 0;

/// What actor_companion::disconnect does (not exported by Debian's
/// libcaf_core 0.17.6): no more handler, then the companion ends.
void end_companion(const caf::strong_actor_ptr& companion) {
  auto* c = companion_of(companion);
  c->on_enqueue({});
  caf::scoped_execution_unit host{&c->home_system()};
  c->cleanup(caf::exit_reason::normal, &host);
}

} // namespace

std::shared_ptr<reply_sink> reply_sink::make(caf::actor_system& sys) {
  std::shared_ptr<reply_sink> s{new reply_sink};
  {
    logger_tie_guard untie; // spawning ties this thread to the system
    s->companion_ = caf::actor_cast<caf::strong_actor_ptr>(sys.spawn<caf::actor_companion>());
  }
  std::weak_ptr<reply_sink> weak = s;
  companion_of(s->companion_)->on_enqueue([weak](caf::mailbox_element_ptr ptr) {
    tsan_acquire(&handler_key);
    struct inside {
      inside() noexcept { ++inside_sink_callback; }
      ~inside() { --inside_sink_callback; }
    } guard; // made before `me`, so it still counts while `me` goes
    // `me` may be the last owner once the reply's handler ran: the sink is
    // then destroyed here, under the companion's lock (see close()).
    auto me = weak.lock();
    if (!me || !ptr || !ptr->mid.is_response())
      return;
    me->deliver(ptr->sender, ptr->mid.request_id().integer_value(),
                ptr->move_content_to_message());
  });
  tsan_release(&handler_key);
  return s;
}

reply_sink::~reply_sink() {
  close(caf::make_error(caf::sec::request_receiver_down));
}

bool reply_sink::wait(const caf::actor& target, uint64_t seq, handler h) {
  return request(target, caf::make_message(atoms::wait_atom::value, seq), std::move(h));
}

bool reply_sink::request(const caf::actor& target, caf::message msg, handler h) {
  if (!target)
    return false;
  uint64_t id = 0;
  caf::strong_actor_ptr from;
  {
    std::lock_guard guard{mu_};
    if (closed_)
      return false;
    id = next_id_++;
    pending_.emplace(id, waiting{target.id(), target.node(), std::move(h)});
    from = companion_;
  }
  caf::actor_cast<caf::abstract_actor*>(target)->enqueue(
    caf::make_mailbox_element(std::move(from), caf::make_message_id(id), {}, std::move(msg)),
    nullptr);
  return true;
}

void reply_sink::deliver(const caf::strong_actor_ptr& sender, uint64_t id,
                         const caf::message& reply) {
  handler h;
  {
    std::lock_guard guard{mu_};
    auto it = pending_.find(id);
    if (it == pending_.end())
      return;
    // From the actor asked, or an anonymous error; anything else is a
    // forgery of another actor's reply (see wait).
    bool from_target = sender ? sender->id() == it->second.target
                                  && sender->node() == it->second.node
                              : reply.match_elements<caf::error>();
    if (!from_target)
      return;
    h = std::move(it->second.h);
    pending_.erase(it);
  }
  try {
    h(reply);
  } catch (...) {
    // The gate's business; the sink goes on.
  }
}

void reply_sink::close(const caf::error& err) {
  std::unordered_map<uint64_t, waiting> pending;
  caf::strong_actor_ptr companion;
  {
    std::lock_guard guard{mu_};
    if (closed_)
      return;
    closed_ = true;
    pending.swap(pending_);
    companion.swap(companion_);
  }
  if (companion) {
    if (inside_sink_callback > 0) {
      // This thread is inside a companion's enqueue, holding its lock
      // (shared): ending the companion here would wait for that lock
      // forever. End it from an actor of its own, on the system's
      // scheduler, once the enqueue returns. Not from a detached thread:
      // the system, which counts the companion as running only until its
      // cleanup begins, could be destroyed while that cleanup still reads
      // it (seen under ASan: a SEGV in actor_system::clock()); the
      // scheduler's workers are joined before the system goes.
      auto& sys = companion_of(companion)->home_system();
      logger_tie_guard untie; // spawning ties this thread to the system
      // (The companion goes as the spawn's argument: CAF 0.17 dereferences
      // a null tuple for a function actor spawned without one.)
      sys.spawn([](caf::event_based_actor*, const caf::strong_actor_ptr& c) { end_companion(c); },
                std::move(companion));
    } else {
      end_companion(companion);
    }
  }
  auto msg = caf::make_message(err);
  for (auto& [id, w] : pending) {
    try {
      w.h(msg);
    } catch (...) {
    }
  }
}

} // namespace multidev::detail
