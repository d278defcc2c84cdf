// Every field of a peer's message is checked before anything is allocated or
// queued (issue 38 point 4, actors/remote/message_checks.hpp): white-box,
// through the actors themselves. Each case sends a device actor or a node
// actor messages with one field class out of bounds (a size, a memory mode,
// a name's or a text's length, a count, a node id) and checks the refusal:
// an `invalid_argument` error naming the field and its value, and the actor
// still answering a well-formed request after it. Requests are bounded by a
// timeout, so a handler that never answers fails the case instead of hanging.
#define BOOST_TEST_MODULE fields
#include <boost/test/unit_test.hpp>

#include <caf/actor_system.hpp>
#include <caf/node_id.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "actors/remote/message_checks.hpp"
#include "test_support.hpp"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using namespace multidev;
using namespace multidev::atoms;
using test_support::contains;

namespace {

constexpr auto reply_limit = 10s;

/// A request's outcome: its value, or the message of its error.
template <class T>
struct outcome {
  std::optional<T> value;
  std::string error; // the multidev error's message (empty: a value came)
  std::string device;
};

/// The message of a multidev error (its context's second string), or CAF's
/// rendering of another one.
std::pair<std::string, std::string> strings_of(caf::actor_system& sys, const caf::error& e) {
  const auto& ctx = e.context();
  if (e.category() == error_category && ctx.size() >= 2 && ctx.match_element<std::string>(0)
      && ctx.match_element<std::string>(1))
    return {ctx.get_as<std::string>(0), ctx.get_as<std::string>(1)};
  return {"", sys.render(e)};
}

/// Sends `xs` to `to` as a request and waits (bounded) for the reply.
template <class T, class Handle, class... Ts>
outcome<T> ask(caf::actor_system& sys, const Handle& to, Ts&&... xs) {
  caf::scoped_actor self{sys};
  outcome<T> out;
  self->request(to, reply_limit, std::forward<Ts>(xs)...)
    .receive([&](T& v) { out.value = std::move(v); },
             [&](caf::error& e) {
               auto [dev, msg] = strings_of(sys, e);
               out.device = dev;
               out.error = msg.empty() ? std::string{"(empty error)"} : msg;
             });
  return out;
}

/// One device of a backend and its actor.
struct one_device {
  backend b{backend_options{.num_devices = 1}};
  device d = b.get_device(0);
  device_actor act = device_actor_of(b, d);
  caf::actor_system& sys = b.system();

  /// The device still answers a well-formed request: a pool allocated.
  void still_serves(int32_t id) {
    auto r = ask<uint64_t>(sys, act, alloc_atom::value, id, uint64_t{64}, uint64_t{64},
                           int32_t{-1});
    BOOST_TEST(r.value.has_value(), "a well-formed alloc after the refusals: " << r.error);
  }
};

/// Checks that `r` is a refusal naming `needle`.
template <class T>
void refused(const outcome<T>& r, const std::string& what, const std::string& needle) {
  BOOST_TEST(!r.value.has_value(), what << " was accepted");
  BOOST_TEST(contains(r.error, needle), what << ": the error '" << r.error << "' does not say '"
                                              << needle << "'");
}

} // namespace

BOOST_AUTO_TEST_CASE(test_fields_alloc_refuses_a_mode_and_an_alignment_out_of_bounds) {
  one_device f;
  // A mode that is no memory mode was taken as "none".
  refused(ask<uint64_t>(f.sys, f.act, alloc_atom::value, int32_t{1}, uint64_t{64}, uint64_t{64},
                        int32_t{7}),
          "alloc of mode 7", "alloc: pool 1: mode 7 is not a memory mode");
  refused(ask<uint64_t>(f.sys, f.act, alloc_atom::value, int32_t{1}, uint64_t{64}, uint64_t{64},
                        int32_t{-2}),
          "alloc of mode -2", "mode -2 is not a memory mode");
  // A power of two above 1 GiB: one byte of quota reserved 2 GiB of address
  // space (the CPU driver rounds the block up to the alignment).
  refused(ask<uint64_t>(f.sys, f.act, alloc_atom::value, int32_t{2}, uint64_t{1},
                        uint64_t{1} << 31, int32_t{-1}),
          "alloc aligned to 2 GiB", "alloc: pool 2: alignment 2147483648 exceeds the limit");
  BOOST_TEST(f.b.get_used_memory(f.d) == 0u);
  f.still_serves(3);
  BOOST_TEST(f.b.get_used_memory(f.d) == 64u);
}

BOOST_AUTO_TEST_CASE(test_fields_names_and_texts_past_their_limits_are_refused) {
  one_device f;
  auto self_actor = caf::actor_cast<caf::actor>(f.act);
  const std::string long_name(1025, 'n');
  const std::string long_host(256, 'h');
  // depend: the owner's name, the host (a depend on itself was a no-op
  // accepted with any name).
  refused(ask<uint64_t>(f.sys, f.act, depend_atom::value, self_actor, uint64_t{0}, long_name),
          "depend with a long owner name", "depend: owner name of 1025 bytes exceeds");
  refused(ask<uint64_t>(f.sys, f.act, depend_atom::value, self_actor, uint64_t{0},
                        std::string{"o"}, long_host, uint16_t{1}),
          "depend with a long host", "depend: host of 256 bytes exceeds");
  // copy_from: the source's name.
  {
    caf::scoped_actor self{f.sys};
    bool answered = false;
    std::string err;
    self->request(f.act, reply_limit, copy_from_atom::value, int32_t{1}, uint64_t{0},
                  uint64_t{0}, caf::actor_cast<caf::actor>(self), long_name, std::string{},
                  uint16_t{0})
      .receive([&](uint64_t, uint64_t) { answered = true; },
               [&](caf::error& e) { err = strings_of(f.sys, e).second; });
    BOOST_TEST(!answered, "copy_from with a long source name was accepted");
    BOOST_TEST(contains(err, "copy_from: source name of 1025 bytes exceeds"), err);
  }
  // schedule: the kernel's name, a text argument (stored on the result
  // board under it).
  refused(ask<uint64_t>(f.sys, f.act, schedule_atom::value, task_spec{std::string(2000, 'k'), {}}),
          "schedule of a long kernel name", "schedule: kernel name of 2000 bytes exceeds");
  f.still_serves(1);
  refused(ask<uint64_t>(f.sys, f.act, schedule_atom::value,
                        task_spec{"checksum", {buffer_arg{buffer_loc{1, 0}, 8},
                                               std::string(5000, 't')}}),
          "checksum with a long result name",
          "schedule: kernel 'checksum' argument 1: text of 5000 bytes exceeds");
  // result: the name.
  {
    caf::scoped_actor self{f.sys};
    std::string err;
    bool answered = false;
    self->request(f.act, reply_limit, result_atom::value, long_name)
      .receive([&](bool, kernel_result&) { answered = true; },
               [&](caf::error& e) { err = strings_of(f.sys, e).second; });
    BOOST_TEST(!answered, "result of a long name was answered");
    BOOST_TEST(contains(err, "result: name of 1025 bytes exceeds"), err);
  }
  f.still_serves(2);
}

BOOST_AUTO_TEST_CASE(test_fields_counts_past_their_limits_are_refused) {
  one_device f;
  // A task of 65 arguments (no kernel takes more than a few).
  task_spec many{"fill", std::vector<kernel_arg>(65, kernel_arg{int64_t{1}})};
  refused(ask<uint64_t>(f.sys, f.act, schedule_atom::value, many), "a task of 65 arguments",
          "schedule: kernel 'fill': argument count 65 exceeds the limit of 64");
  // The same inside a batch: none of it is scheduled.
  std::vector<task_spec> batch{task_spec{"fill", {buffer_arg{buffer_loc{1, 0}, 8}, 1.0}}, many};
  auto r = ask<std::vector<uint64_t>>(f.sys, f.act, schedule_atom::value, batch);
  refused(r, "a batch with a task of 65 arguments", "argument count 65 exceeds");
  f.still_serves(1);
}

namespace {

/// A node actor serving `b`'s devices, with a cookie file of its own.
struct one_node {
  std::filesystem::path dir = [] {
    std::string templ = (std::filesystem::temp_directory_path() / "test_fields.XXXXXX").string();
    BOOST_TEST_REQUIRE(::mkdtemp(templ.data()) != nullptr);
    return std::filesystem::path{templ};
  }();
  backend b{backend_options{.num_devices = 1}};
  std::string cookie_file = (dir / "cookie").string();
  std::string cookie = load_cookie(cookie_file);
  node_actor node = spawn_node_actor(b, "n", cookie_file);
  caf::actor_system& sys = b.system();

  ~one_node() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  using opened = std::tuple<std::string, std::string, uint64_t, int64_t, std::vector<caf::actor>>;

  /// Opens a session for `client`; its id, or the error's message.
  outcome<uint64_t> open(const std::string& client) {
    caf::scoped_actor self{sys};
    outcome<uint64_t> out;
    self->request(node, reply_limit, open_atom::value, client, int64_t{10'000'000'000}, cookie)
      .receive(
        [&](std::string&, std::string&, uint64_t id, int64_t, std::vector<caf::actor>&) {
          out.value = id;
        },
        [&](caf::error& e) { out.error = strings_of(sys, e).second; });
    return out;
  }
};

caf::node_id some_node(uint32_t n) {
  caf::node_id::default_data::host_id_type host{};
  host[0] = 0x5a;
  host[1] = static_cast<uint8_t>(n);
  host[2] = static_cast<uint8_t>(n >> 8);
  return caf::make_node_id(4242 + n, host);
}

} // namespace

BOOST_AUTO_TEST_CASE(test_fields_node_refuses_a_long_client_name_and_too_many_sessions) {
  one_node f;
  refused(f.open(std::string(1025, 'c')), "open with a long client name",
          "open: client name of 1025 bytes exceeds");
  // Each session is a backend of its own (runners, pools): one client node
  // holds at most 16 at once.
  std::vector<uint64_t> ids;
  for (int i = 0; i < 16; ++i) {
    auto r = f.open("client");
    BOOST_TEST_REQUIRE(r.value.has_value(), "session " << i << ": " << r.error);
    ids.push_back(*r.value);
  }
  refused(f.open("client"), "a 17th session", "holds 16 sessions already (at most 16)");
  // Detaching one makes room again.
  auto d = ask<bool>(f.sys, f.node, detach_atom::value, ids.back());
  BOOST_TEST((d.value && *d.value), d.error);
  auto again = f.open("client");
  BOOST_TEST(again.value.has_value(), again.error);
}

BOOST_AUTO_TEST_CASE(test_fields_trust_refuses_the_invalid_node_and_too_many_nodes) {
  one_node f;
  auto s = f.open("client");
  BOOST_TEST_REQUIRE(s.value.has_value(), s.error);
  refused(ask<bool>(f.sys, f.node, trust_atom::value, *s.value, caf::node_id{}),
          "trust of the invalid node id", "trust: node is the invalid node id");
  for (uint32_t i = 0; i < 64; ++i) {
    auto r = ask<bool>(f.sys, f.node, trust_atom::value, *s.value, some_node(i));
    BOOST_TEST_REQUIRE((r.value && *r.value), "node " << i << ": " << r.error);
  }
  // A node vouched for already is no new one.
  auto same = ask<bool>(f.sys, f.node, trust_atom::value, *s.value, some_node(3));
  BOOST_TEST((same.value && *same.value), same.error);
  refused(ask<bool>(f.sys, f.node, trust_atom::value, *s.value, some_node(64)),
          "a 65th node vouched for", "vouches for 64 nodes already (at most 64)");
  auto renew = ask<int64_t>(f.sys, f.node, renew_atom::value, *s.value, uint64_t{1}, uint64_t{0});
  BOOST_TEST(renew.value.has_value(), "the node serves the session after: " << renew.error);
}

BOOST_AUTO_TEST_CASE(test_fields_spin_ns_refuses_a_duration_past_an_hour) {
  // `now + NS` overflowed the clock's nanoseconds for NS near INT64_MAX
  // (undefined behaviour; in practice the spin ended at once).
  one_device f;
  refused(ask<uint64_t>(f.sys, f.act, schedule_atom::value,
                        task_spec{"spin_ns", {std::numeric_limits<int64_t>::max()}}),
          "spin_ns of INT64_MAX ns", "NS (argument 0) is 9223372036854775807; must be >= 0 and at most");
  refused(ask<uint64_t>(f.sys, f.act, schedule_atom::value,
                        task_spec{"spin_ns", {int64_t{3'600'000'000'001}}}),
          "spin_ns of an hour and a nanosecond", "at most 3600000000000");
  auto ok = ask<uint64_t>(f.sys, f.act, schedule_atom::value, task_spec{"spin_ns", {int64_t{0}}});
  BOOST_TEST(ok.value.has_value(), ok.error);
}

BOOST_AUTO_TEST_CASE(test_fields_requests_deferred_behind_a_full_queue_are_bounded) {
  // A peer that sends without waiting for replies was held back by the
  // deferral, which had no bound: each message a closure more in memory.
  backend b{backend_options{.num_devices = 1, .queue_capacity = 1}};
  auto d = b.get_device(0);
  auto release = test_support::block_runner(b, d);
  b.schedule_task(d, {"fills the queue", [] {}});
  auto act = device_actor_of(b, d);
  caf::scoped_actor self{b.system()};
  for (int i = 0; i < 65536; ++i)
    self->send(act, all_work_atom::value); // deferred: no reply is asked
  std::string err;
  bool answered = false;
  self->request(act, std::chrono::seconds{5}, all_work_atom::value)
    .receive([&](uint64_t) { answered = true; },
             [&](caf::error& e) { err = strings_of(b.system(), e).second; });
  BOOST_TEST(!answered, "a request past the bound was deferred and answered");
  BOOST_TEST(contains(err, "65536 requests wait for room already (at most 65536)"), err);
  release->open();
  // The deferred ones drain once the runner makes room (a request may come
  // before that and be refused again); then the device serves.
  BOOST_TEST(test_support::eventually(
    [&] { return ask<uint64_t>(b.system(), act, all_work_atom::value).value.has_value(); }));
}

BOOST_AUTO_TEST_CASE(test_fields_a_stray_error_message_stops_neither_a_device_nor_the_node) {
  // A message that is only a caf::error (a peer's, or the refusal an actor
  // a copy_to sent its bytes to answered with) made CAF's default error
  // handler quit the actor: the device, or the node for every session.
  one_node f;
  auto s = f.open("client");
  BOOST_TEST_REQUIRE(s.value.has_value(), s.error);
  auto dev = device_actor_of(f.b, f.b.get_device(0));
  caf::scoped_actor self{f.sys};
  self->send(caf::actor_cast<caf::actor>(dev), caf::make_error(caf::sec::unexpected_message));
  self->send(caf::actor_cast<caf::actor>(f.node), caf::make_error(caf::sec::unexpected_message));
  // A device's copy_to whose destination is the node actor: the node
  // refuses the bytes, its refusal comes back to the device.
  auto pool = ask<uint64_t>(f.sys, dev, alloc_atom::value, int32_t{1}, uint64_t{8}, uint64_t{8},
                            int32_t{-1});
  BOOST_TEST_REQUIRE(pool.value.has_value(), pool.error);
  auto copy = ask<uint64_t>(f.sys, dev, copy_to_atom::value, int32_t{1}, uint64_t{0}, uint64_t{8},
                            caf::actor_cast<caf::actor>(f.node), uint64_t{1});
  BOOST_TEST_REQUIRE(copy.value.has_value(), copy.error);
  auto done = ask<uint64_t>(f.sys, dev, wait_atom::value, *copy.value);
  BOOST_TEST(done.value.has_value(), done.error);
  // The node has handled the bytes (sent before the wait's reply) once it
  // answers this; its refusal is then in the device's mailbox before the
  // next request.
  auto debug = ask<std::string>(f.sys, f.node, debug_atom::value);
  BOOST_TEST(debug.value.has_value(), "the node after the stray error: " << debug.error);
  auto id = ask<uint64_t>(f.sys, dev, all_work_atom::value);
  BOOST_TEST(id.value.has_value(), "the device after the stray errors: " << id.error);
  auto again = f.open("client");
  BOOST_TEST(again.value.has_value(), again.error);
}

namespace {

/// An owner that takes `wait` requests and answers none until told
/// ("answer"), then each with `value`: a seq of it that a device depends on
/// stays pending until then. (An argument: CAF 0.17 spawns a function actor
/// without one through a null `shared_ptr<std::tuple<>>`, which UBSan
/// reports.)
struct silent_owner_state {
  std::vector<caf::response_promise> held;
};

caf::behavior silent_owner(caf::stateful_actor<silent_owner_state>* self, uint64_t value) {
  return {
    [self](wait_atom, uint64_t) -> caf::result<uint64_t> {
      self->state.held.push_back(self->make_response_promise());
      return caf::delegated<uint64_t>{};
    },
    [self, value](const std::string&) {
      for (auto& rp : self->state.held)
        rp.deliver(value);
      self->state.held.clear();
    },
  };
}

/// Opens a session for `client` on `f`'s node: its devices.
std::vector<caf::actor> session_devices(one_node& f, const std::string& client) {
  caf::scoped_actor self{f.sys};
  std::vector<caf::actor> devs;
  std::string err;
  self->request(f.node, reply_limit, open_atom::value, client, int64_t{10'000'000'000}, f.cookie)
    .receive([&](std::string&, std::string&, uint64_t, int64_t,
                 std::vector<caf::actor>& ds) { devs = std::move(ds); },
             [&](caf::error& e) { err = strings_of(f.sys, e).second; });
  BOOST_TEST_REQUIRE(devs.size() == 1u, "session for " << client << ": " << err);
  return devs;
}

/// The waits session `id` of `f`'s node holds, from the node's `debug`
/// ("(session (id 1) ... (waits N))"); what went wrong otherwise.
std::string session_waits(one_node& f, uint64_t id) {
  auto d = ask<std::string>(f.sys, f.node, debug_atom::value);
  if (!d.value)
    return "(no debug: " + d.error + ")";
  auto at = d.value->find("(session (id " + std::to_string(id) + ") ");
  auto w = at == std::string::npos ? at : d.value->find("(waits ", at);
  if (w == std::string::npos)
    return "(not in " + *d.value + ")";
  w += 7;
  return d.value->substr(w, d.value->find(')', w) - w);
}

} // namespace

BOOST_AUTO_TEST_CASE(test_fields_a_sessions_waits_are_bounded) {
  // A session's client could register any number of `wait`s on a seq that
  // never resolves: each a reply owed, held by the device until the seq
  // resolves (maybe never). 65,536 at once per session; the next is
  // refused naming the session and the limit, and the node serves on.
  one_node f;
  auto a = session_devices(f, "a");
  auto owner = f.sys.spawn(silent_owner, uint64_t{1});
  auto gate = ask<uint64_t>(f.sys, a[0], depend_atom::value, owner, uint64_t{1});
  BOOST_TEST_REQUIRE(gate.value.has_value(), gate.error);
  caf::scoped_actor self{f.sys};
  for (int i = 0; i < 65536; ++i)
    self->send(a[0], wait_atom::value, *gate.value); // registered: its seq is pending
  refused(ask<uint64_t>(f.sys, a[0], wait_atom::value, *gate.value),
          "a wait past the session's bound",
          "wait: session 1 of node n holds 65536 waits for their requesters already (at most "
          "65536 at once)");
  BOOST_TEST(session_waits(f, 1) == "65536");
  // The session goes on; another session is served.
  auto pool = ask<uint64_t>(f.sys, a[0], alloc_atom::value, int32_t{1}, uint64_t{64},
                            uint64_t{64}, int32_t{-1});
  BOOST_TEST(pool.value.has_value(), "session a after the refusal: " << pool.error);
  auto b = session_devices(f, "b");
  auto other = ask<uint64_t>(f.sys, b[0], alloc_atom::value, int32_t{1}, uint64_t{64},
                             uint64_t{64}, int32_t{-1});
  BOOST_TEST(other.value.has_value(), "session b: " << other.error);
  // The awaited seq resolves (the reply reaches the device through its
  // reply sink, a hop later): every wait answered, their tickets back.
  self->send(owner, std::string{"answer"});
  std::string last;
  BOOST_TEST(test_support::eventually([&] { return (last = session_waits(f, 1)) == "0"; }),
             "session 1 holds " << last << " waits after the awaited seq resolved");
  auto done = ask<uint64_t>(f.sys, a[0], wait_atom::value, *gate.value);
  BOOST_TEST(done.value.has_value(), done.error);
  self->send_exit(owner, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(test_fields_a_wait_budget_gives_a_ticket_back_as_it_goes) {
  // What the session's devices share: a ticket per wait, back when the
  // wait's last copy goes (answered or dropped).
  detail::wait_budget budget;
  std::vector<std::shared_ptr<void>> tickets;
  for (std::size_t i = 0; i < detail::wire_limits::session_waits; ++i)
    tickets.push_back(budget.take("session 1 of node n", i));
  BOOST_TEST(budget.held() == detail::wire_limits::session_waits);
  std::string err;
  try {
    budget.take("session 1 of node n", 99);
  } catch (const std::invalid_argument& e) {
    err = e.what();
  }
  BOOST_TEST(contains(err, "the wait for seq 99 is refused"), err);
  auto copy = tickets.back();
  tickets.pop_back();
  BOOST_TEST(budget.held() == detail::wire_limits::session_waits, "a copy holds the ticket");
  copy.reset();
  BOOST_TEST(budget.held() == detail::wire_limits::session_waits - 1);
  {
    auto again = budget.take("session 1 of node n", 100); // room again
    BOOST_TEST(budget.held() == detail::wire_limits::session_waits);
  }
  tickets.clear();
  BOOST_TEST(budget.held() == 0u);
}
