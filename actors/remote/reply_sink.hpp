#pragma once
/// \file
/// Where the replies to `wait` requests land when nothing but a gate waits
/// for them: an actor companion whose enqueue runs the reply's handler on
/// the thread that delivers it (for a reply from another node, CAF's I/O
/// thread, since `middleman.workers` is 0), instead of scheduling an actor
/// on a CAF worker first. One thread wake-up less per remote hop: the gate
/// opens and rings its runner from the I/O thread.

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/actor_control_block.hpp>
#include <caf/error.hpp>
#include <caf/message.hpp>
#include <caf/node_id.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace caf {
class actor_system;
}

namespace multidev::detail {

class reply_sink : public std::enable_shared_from_this<reply_sink> {
public:
  /// The reply: a `uint64_t` (the seq, done) or a `caf::error`.
  using handler = std::function<void(const caf::message&)>;

  static std::shared_ptr<reply_sink> make(caf::actor_system& sys);
  ~reply_sink();
  reply_sink(const reply_sink&) = delete;
  reply_sink& operator=(const reply_sink&) = delete;

  /// Sends `(wait, seq)` to `target` as a request from the sink; `h` runs
  /// once with the reply, on the thread that delivers it, or with `close`'s
  /// error. False (and `h` never runs) once closed. Only a reply from
  /// `target` itself counts (issue 38 point 2): request ids are sequential,
  /// so another actor that waits here could answer this wait's id; its
  /// reply is dropped and the wait stays pending. An anonymous reply counts
  /// only when it is an error (CAF bounces a request to an actor it cannot
  /// reach with one): it can fail a wait, never open it.
  bool wait(const caf::actor& target, uint64_t seq, handler h);
  /// Sends `msg` to `target` as a request from the sink, with `wait`'s
  /// rules for its reply (a recorded round's `round_put` and `round_run`
  /// to a node's actor: one sender, so they arrive in the order sent).
  bool request(const caf::actor& target, caf::message msg, handler h);
  /// Runs every pending handler with `err`, refuses later requests and ends
  /// the companion (peers that monitor it hear it went).
  void close(const caf::error& err);

private:
  reply_sink() = default;
  void deliver(const caf::strong_actor_ptr& sender, uint64_t id, const caf::message& reply);

  struct waiting {
    /// Who was asked: its id and node (a remote owner is a proxy here).
    caf::actor_id target;
    caf::node_id node;
    handler h;
  };

  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, waiting> pending_;
  bool closed_ = false;
  caf::strong_actor_ptr companion_;
};

} // namespace multidev::detail
