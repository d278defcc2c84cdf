// libFuzzer harness for the protocol of the device and node actors (issue 38
// point 6): what a peer's bytes and messages can do to a node.
//
// An input whose first byte is even is bytes for CAF's binary deserializer:
// read as a `caf::message` (sent to a session's device actor when it
// deserializes) and as each of the protocol's value types. An odd first
// byte makes the rest a program of up to 32 well-typed messages, their
// fields drawn at their extremes (0, 1, the maximum, the sign bit, ...) or
// small (pool ids, offsets and sizes that hit real pools), sent to the
// device actor of a session and to the node actor.
//
// Each input runs in a session of its own (opened before, detached after:
// its pools freed, its queue cancelled), whose memory limit (64 MiB) bounds
// what it may allocate. After each input the device actor must answer
// `identify` and the node actor `debug` within 5 s, or the harness aborts
// (libFuzzer reports the input); a crash, a sanitizer report and memory
// past -rss_limit_mb are libFuzzer's own findings.
#include <fuzzer/FuzzedDataProvider.h>

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message.hpp>
#include <caf/message_id.hpp>
#include <caf/node_id.hpp>
#include <caf/scoped_actor.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace multidev;
using namespace multidev::atoms;

namespace {

/// How long an actor may take to answer the well-formed request after an input.
constexpr auto answer_limit = std::chrono::seconds{5};
/// What one input's session may hold in its pools.
constexpr std::size_t session_memory = std::size_t{64} << 20;

[[noreturn]] void fatal(const std::string& what) {
  std::fprintf(stderr, "fuzz_protocol: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// The node the inputs talk to: an actor system (no middleman: the messages
/// go to the actors as a peer's would after BASP), a backend of one CPU
/// device, and a node actor serving sessions of it.
struct world {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<backend> b;
  node_actor node;
  std::string cookie;

  world() {
    register_types(cfg);
    cfg.set("scheduler.max-threads", std::size_t{2});
    sys = std::make_unique<caf::actor_system>(cfg);
    b = std::make_unique<backend>(*sys, backend_options{.num_devices = 1});
    char dir[] = "/tmp/fuzz_protocol.XXXXXX";
    if (::mkdtemp(dir) == nullptr)
      fatal("cannot make a folder for the cookie");
    auto file = std::string{dir} + "/cookie";
    cookie = load_cookie(file);
    node = spawn_node_actor(*b, "fuzz", file, session_memory);
  }
};

/// One world for the whole run: never destroyed (libFuzzer exits without
/// running destructors on a finding, and the system's threads stay).
world& the_world() {
  static auto* w = new world;
  return *w;
}

struct session {
  uint64_t id = 0;
  caf::actor dev;
};

session open_session(world& w) {
  caf::scoped_actor self{*w.sys};
  session s;
  self->request(w.node, answer_limit, open_atom::value, std::string{"fuzz"},
                int64_t{3'600'000'000'000}, w.cookie)
    .receive(
      [&](std::string&, std::string&, uint64_t id, int64_t, std::vector<caf::actor>& devices) {
        s.id = id;
        if (!devices.empty())
          s.dev = devices[0];
      },
      [&](caf::error& e) { fatal("the node refused a session: " + w.sys->render(e)); });
  if (!s.dev)
    fatal("the session has no device");
  if (std::getenv("MULTIDEV_FUZZ_VERBOSE") != nullptr) {
    auto* sys = w.sys.get();
    s.dev->attach_functor([sys](const caf::error& reason) {
      std::fprintf(stderr, "fuzz_protocol: the device actor exited: %s\n",
                   sys->render(reason).c_str());
    });
  }
  return s;
}

/// The actors still answer a well-formed request, within `answer_limit`.
void check_alive(world& w, const session& s) {
  caf::scoped_actor self{*w.sys};
  auto dev = caf::actor_cast<device_actor>(s.dev);
  self->request(dev, answer_limit, identify_atom::value)
    .receive([](std::string&, uint32_t, std::string&, std::string&, int32_t) {},
             [&](caf::error& e) {
               std::string node_debug;
               self->request(w.node, answer_limit, debug_atom::value)
                 .receive([&](std::string& text) { node_debug = text; },
                          [&](caf::error& e2) { node_debug = w.sys->render(e2); });
               fatal("the device actor of session " + std::to_string(s.id)
                     + " did not answer identify: " + w.sys->render(e) + "; the node: "
                     + node_debug);
             });
  self->request(w.node, answer_limit, debug_atom::value)
    .receive([](std::string&) {},
             [&](caf::error& e) { fatal("the node actor did not answer debug: " + w.sys->render(e)); });
}

void detach(world& w, const session& s) {
  caf::scoped_actor self{*w.sys};
  self->request(w.node, answer_limit, detach_atom::value, s.id)
    .receive([](bool) {},
             [&](caf::error& e) { fatal("detach was refused: " + w.sys->render(e)); });
}

// -- fields at their extremes ----------------------------------------------------

template <class T>
T extreme(FuzzedDataProvider& in) {
  using lim = std::numeric_limits<T>;
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return T{0};
    case 1: return T{1};
    case 2: return lim::max();
    case 3: return static_cast<T>(lim::max() - 1);
    case 4: return lim::min();
    case 5: return static_cast<T>(lim::max() / 2 + 1);
    case 6: return static_cast<T>(-1);
    default: return in.ConsumeIntegral<T>();
  }
}

/// Mostly small (a real pool, offset or size), sometimes extreme.
template <class T>
T small_or_extreme(FuzzedDataProvider& in, T small) {
  if (in.ConsumeBool())
    return in.ConsumeIntegralInRange<T>(0, small);
  return extreme<T>(in);
}

std::string text(FuzzedDataProvider& in) {
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0)
    return std::string(in.ConsumeIntegralInRange<std::size_t>(0, 8192), 'x');
  return in.ConsumeRandomLengthString(64);
}

/// A kernel's name: a known one mostly. `spin_ns` is left out: a spin of up
/// to an hour is a valid request that would hold the session's teardown.
std::string kernel_name(FuzzedDataProvider& in) {
  static const char* known[] = {"fill", "iota", "scale", "axpy", "checksum", "add_from_merge",
                                "fail"};
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
    auto s = text(in);
    return s == "spin_ns" ? std::string{"spin"} : s;
  }
  return known[in.ConsumeIntegralInRange<std::size_t>(0, std::size(known) - 1)];
}

kernel_arg argument(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0: return std::monostate{};
    case 1: return extreme<int64_t>(in);
    case 2: return in.ConsumeFloatingPoint<double>();
    case 3: return text(in);
    default:
      return buffer_arg{buffer_loc{small_or_extreme<int>(in, 3),
                                   small_or_extreme<std::size_t>(in, 4096)},
                        small_or_extreme<std::size_t>(in, 4096)};
  }
}

task_spec spec(FuzzedDataProvider& in) {
  task_spec s{kernel_name(in), {}};
  auto n = in.ConsumeIntegralInRange<int>(0, in.ConsumeIntegralInRange<int>(0, 15) == 0 ? 80 : 4);
  for (int i = 0; i < n; ++i)
    s.args.push_back(argument(in));
  return s;
}

std::vector<task_spec> specs(FuzzedDataProvider& in) {
  std::vector<task_spec> v;
  auto n = in.ConsumeIntegralInRange<int>(0, 6);
  for (int i = 0; i < n; ++i)
    v.push_back(spec(in));
  if (in.ConsumeIntegralInRange<int>(0, 31) == 0) // a large batch of one repeated spec
    v.resize(in.ConsumeIntegralInRange<std::size_t>(0, 20000), task_spec{"fill", {}});
  return v;
}

/// A recorded round's part for a node (`round_put`): mostly well formed
/// (lanes of the session's devices, tasks and waits on earlier steps), with
/// fields out of range where the input says so.
round_part part(FuzzedDataProvider& in, const caf::actor& some) {
  round_part p;
  p.round = small_or_extreme<uint64_t>(in, 4);
  p.name = text(in);
  auto lanes = in.ConsumeIntegralInRange<int>(0, 3);
  for (int l = 0; l < lanes; ++l)
    p.devices.push_back(small_or_extreme<uint32_t>(in, 2));
  auto steps = in.ConsumeIntegralInRange<int>(0, 8);
  for (int k = 0; k < steps; ++k) {
    round_step st;
    st.item = small_or_extreme<uint32_t>(in, 16);
    st.lane = small_or_extreme<uint32_t>(in, 2);
    st.wait_on = in.ConsumeIntegralInRange<int32_t>(-3, k + 1);
    st.peer = small_or_extreme<uint32_t>(in, 2);
    st.peer_item = small_or_extreme<uint32_t>(in, 16);
    st.name = text(in);
    st.op = in.ConsumeIntegralInRange<uint8_t>(0, 6);
    if ((st.op == round_step::zero || st.op == round_step::send || st.op == round_step::write)
        && in.ConsumeBool())
      st.spec = task_spec{{},
                          {buffer_arg{buffer_loc{small_or_extreme<int>(in, 3),
                                                 small_or_extreme<std::size_t>(in, 4096)},
                                      small_or_extreme<std::size_t>(in, 4096)}}}; // a memset's or a copy's span
    else if ((st.op == round_step::alloc || st.op == round_step::free) && in.ConsumeBool()) {
      // A pool call: the pool at offset 0 (mostly), its size, alignment and
      // mode (the session's quota bounds what an alloc_pool takes).
      st.spec = task_spec{{},
                          {buffer_arg{buffer_loc{small_or_extreme<int>(in, 3),
                                                 in.ConsumeBool() ? 0 : small_or_extreme<std::size_t>(in, 64)},
                                      small_or_extreme<std::size_t>(in, 1 << 20)}}};
      st.alignment = small_or_extreme<uint64_t>(in, 128);
      st.mode = in.ConsumeIntegralInRange<int32_t>(-2, 8);
    } else if (st.wait_on == -1)
      st.spec = spec(in);
    p.steps.push_back(std::move(st));
  }
  auto slots = in.ConsumeIntegralInRange<int>(0, 2);
  for (int k = 0; k < slots; ++k) {
    p.slot_steps.push_back(small_or_extreme<uint32_t>(in, 8));
    p.slot_args.push_back(small_or_extreme<uint32_t>(in, 2));
  }
  if (in.ConsumeBool())
    p.peers.push_back(round_peer{some, extreme<uint64_t>(in), text(in), text(in),
                                 in.ConsumeIntegral<uint16_t>()});
  if (in.ConsumeBool()) {
    p.notify_steps.push_back(small_or_extreme<uint32_t>(in, 8));
    p.notify_peers.push_back(small_or_extreme<uint32_t>(in, 1));
  }
  return p;
}

caf::node_id some_node(FuzzedDataProvider& in) {
  if (in.ConsumeBool())
    return {};
  caf::node_id::default_data::host_id_type host{};
  for (auto& x : host)
    x = in.ConsumeIntegral<uint8_t>();
  return caf::make_node_id(in.ConsumeIntegral<uint32_t>(), host);
}

/// Sends one message the input describes to the session's device actor or
/// the node actor.
void one_message(FuzzedDataProvider& in, world& w, const session& s, caf::scoped_actor& self) {
  auto dev = caf::actor_cast<device_actor>(s.dev);
  // An actor handle: the device itself, the node actor, the sender, or none.
  auto some_actor = [&]() -> caf::actor {
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: return s.dev;
      case 1: return caf::actor_cast<caf::actor>(w.node);
      case 2: return caf::actor_cast<caf::actor>(self);
      default: return {};
    }
  };
  auto pool = [&] { return small_or_extreme<int32_t>(in, 3); };
  auto offset = [&] { return small_or_extreme<uint64_t>(in, 4096); };
  auto size = [&] { return small_or_extreme<uint64_t>(in, 8192); };
  auto seq = [&] { return small_or_extreme<uint64_t>(in, 16); };
  auto op = in.ConsumeIntegralInRange<int>(0, 36);
  static const bool verbose = std::getenv("MULTIDEV_FUZZ_VERBOSE") != nullptr;
  if (verbose)
    std::fprintf(stderr, "fuzz_protocol: message kind %d\n", op);
  switch (op) {
    case 0: self->send(dev, schedule_atom::value, spec(in)); break;
    case 1: self->send(dev, schedule_atom::value, specs(in)); break;
    case 2: {
      auto batch = small_or_extreme<uint64_t>(in, 2);
      auto part = small_or_extreme<uint32_t>(in, 2);
      auto v = specs(in);
      self->send(dev, schedule_atom::value, batch, part, std::move(v), in.ConsumeBool());
      break;
    }
    case 3: self->send(dev, wait_atom::value, seq()); break;
    case 4: self->send(dev, wait_atom::value, cancel_atom::value, seq(), extreme<uint64_t>(in)); break;
    case 5: self->send(dev, depend_atom::value, some_actor(), seq()); break;
    case 6: self->send(dev, depend_atom::value, some_actor(), seq(), text(in)); break;
    case 7:
      self->send(dev, depend_atom::value, some_actor(), seq(), text(in), text(in),
                 extreme<uint16_t>(in));
      break;
    case 8: self->send(dev, lost_atom::value, some_actor(), text(in)); break;
    case 9:
    case 10:
      self->send(dev, alloc_atom::value, pool(), size(), small_or_extreme<uint64_t>(in, 128),
                 small_or_extreme<int32_t>(in, 8));
      break;
    case 11: self->send(dev, free_atom::value, pool()); break;
    case 12: self->send(dev, memset_atom::value, pool(), offset(), size()); break;
    case 13: {
      auto p = pool();
      auto o = offset();
      self->send(dev, write_atom::value, p, o, text(in));
      break;
    }
    case 14: self->send(dev, read_atom::value, pool(), offset(), size()); break;
    case 15: {
      auto p = pool();
      auto o = offset();
      auto n = size();
      self->send(dev, copy_from_atom::value, p, o, n, some_actor(), text(in), std::string{},
                 extreme<uint16_t>(in));
      break;
    }
    case 16: {
      auto p = pool();
      auto o = offset();
      auto n = size();
      self->send(dev, copy_to_atom::value, p, o, n, some_actor(), small_or_extreme<uint64_t>(in, 4));
      break;
    }
    case 17: {
      auto t = small_or_extreme<uint64_t>(in, 4);
      self->send(dev, bytes_atom::value, t, text(in));
      break;
    }
    case 18:
      self->send(dev, bytes_atom::value, small_or_extreme<uint64_t>(in, 4),
                 make_error(errc::device_failed, text(in), text(in)));
      break;
    case 19: self->send(dev, status_atom::value, seq()); break;
    case 20: self->send(dev, why_atom::value, seq()); break;
    case 21: self->send(dev, result_atom::value, text(in)); break;
    case 22: self->send(dev, all_work_atom::value); break;
    case 23: self->send(dev, idle_atom::value); break;
    case 24: self->send(dev, memory_atom::value); break;
    case 25: self->send(dev, debug_atom::value); break;
    case 26: self->send(dev, trace_atom::value); break;
    case 27: self->send(dev, cancel_atom::value); break;
    case 28: self->send(dev, recover_atom::value); break;
    case 29: {
      // The node: a session opened (wrong cookie mostly; a right one is
      // detached again at once).
      bool right = in.ConsumeIntegralInRange<int>(0, 3) == 0;
      auto client = text(in);
      auto lease = extreme<int64_t>(in);
      self->request(w.node, answer_limit, open_atom::value, client, lease,
                    right ? w.cookie : text(in))
        .receive(
          [&](std::string&, std::string&, uint64_t id, int64_t, std::vector<caf::actor>&) {
            self->request(w.node, answer_limit, detach_atom::value, id)
              .receive([](bool) {}, [](caf::error&) {});
          },
          [](caf::error&) {});
      break;
    }
    case 30: {
      // Renew, or trust: of this session or another id (never a detach of
      // this one: its device must answer after the input).
      auto id = in.ConsumeBool() ? s.id : extreme<uint64_t>(in);
      if (in.ConsumeBool()) {
        auto n = extreme<uint64_t>(in);
        auto acked = extreme<uint64_t>(in);
        self->request(w.node, answer_limit, renew_atom::value, id, n, acked)
          .receive([](int64_t) {}, [](caf::error&) {});
      } else {
        self->request(w.node, answer_limit, trust_atom::value, id, some_node(in))
          .receive([](bool) {}, [](caf::error&) {});
      }
      break;
    }
    case 31: {
      // A recorded round's part, of this session or another id.
      auto id = in.ConsumeBool() ? s.id : extreme<uint64_t>(in);
      self->request(w.node, answer_limit, round_put_atom::value, id, part(in, some_actor()))
        .receive([](bool) {}, [](caf::error&) {});
      break;
    }
    case 32: {
      // A replay: of a round put before, or not; slots of any kind.
      auto id = in.ConsumeBool() ? s.id : extreme<uint64_t>(in);
      auto round = small_or_extreme<uint64_t>(in, 4);
      auto n = small_or_extreme<uint64_t>(in, 8);
      std::vector<wire_arg> slots;
      auto k = in.ConsumeIntegralInRange<int>(0, 2);
      for (int i = 0; i < k; ++i) {
        wire_arg a;
        a.kind = in.ConsumeIntegral<uint8_t>();
        a.integer = extreme<int64_t>(in);
        a.text = text(in);
        slots.push_back(std::move(a));
      }
      self->request(w.node, answer_limit, round_run_atom::value, id, round, n, std::move(slots))
        .receive([](std::vector<uint64_t>&) {}, [](caf::error&) {});
      break;
    }
    case 33: {
      // Notices from a node the parts do not name (this process's).
      std::vector<round_notice> v;
      auto k = in.ConsumeIntegralInRange<int>(0, 4);
      for (int i = 0; i < k; ++i) {
        round_notice x;
        x.round = small_or_extreme<uint64_t>(in, 4);
        x.replay = small_or_extreme<uint64_t>(in, 8);
        x.item = small_or_extreme<uint32_t>(in, 16);
        x.seq = seq();
        if (in.ConsumeBool())
          x.error = make_error(errc::device_failed, text(in), text(in));
        if (in.ConsumeBool()) { // a copy's bytes
          x.offset = small_or_extreme<uint64_t>(in, 4096);
          x.bytes = text(in);
        }
        v.push_back(std::move(x));
      }
      self->send(w.node, round_done_atom::value, in.ConsumeBool() ? s.id : extreme<uint64_t>(in),
                 std::move(v));
      break;
    }
    case 34:
      self->request(w.node, answer_limit, round_drop_atom::value,
                    in.ConsumeBool() ? s.id : extreme<uint64_t>(in),
                    small_or_extreme<uint64_t>(in, 4))
        .receive([](bool) {}, [](caf::error&) {});
      break;
    case 35:
      self->send(w.node, lost_atom::value, in.ConsumeBool() ? s.id : extreme<uint64_t>(in),
                 some_actor(), text(in));
      break;
    case 36:
      self->request(w.node, answer_limit, round_refused_atom::value,
                    in.ConsumeBool() ? s.id : extreme<uint64_t>(in),
                    small_or_extreme<uint64_t>(in, 4), small_or_extreme<uint64_t>(in, 8),
                    some_actor(), text(in))
        .receive([](bool) {}, [](caf::error&) {});
      break;
    default: {
      auto id = extreme<uint64_t>(in);
      if (id != s.id)
        self->request(w.node, answer_limit, detach_atom::value, id)
          .receive([](bool) {}, [](caf::error&) {});
      break;
    }
  }
}

/// Bytes for the deserializer: as a message (sent to the device when it
/// deserializes) and as each value type of the protocol.
void bytes_input(const uint8_t* data, std::size_t size, world& w, const session& s) {
  auto* p = reinterpret_cast<const char*>(data);
  {
    caf::binary_deserializer source{*w.sys, p, size};
    caf::message msg;
    if (!source(msg) && !msg.empty()) {
      auto dest = caf::actor_cast<caf::strong_actor_ptr>(s.dev);
      dest->enqueue(caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, std::move(msg)),
                    nullptr);
    }
  }
  auto as = [&](auto value) {
    caf::binary_deserializer source{*w.sys, p, size};
    static_cast<void>(source(value));
  };
  as(task_spec{});
  as(std::vector<task_spec>{});
  as(wire_arg{});
  as(failure{});
  as(trace_record{});
  as(device_trace{});
  as(kernel_result{});
  as(device_key{});
  as(event{});
  as(round_part{});
  as(std::vector<round_notice>{});
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  auto& w = the_world();
  auto s = open_session(w);
  if (size > 0 && data[0] % 2 == 0) {
    bytes_input(data + 1, size - 1, w, s);
  } else {
    FuzzedDataProvider in{data, size};
    in.ConsumeIntegral<uint8_t>(); // the mode
    caf::scoped_actor self{*w.sys};
    for (int i = 0; i < 32 && in.remaining_bytes() > 0; ++i)
      one_message(in, w, s, self);
  }
  check_alive(w, s);
  detach(w, s);
  return 0;
}
