// Embedding (docs/embedding.md): a backend on an actor system the program
// already owns, configured as the guide says, and actors of the program's
// own that drive devices by message.
//
//   driver actor ──(schedule fill)─────> device 0 actor ──seq──> driver
//   driver actor ──(schedule checksum)─> device 0 actor ──seq──> driver
//   driver actor ──(wait seq)──────────> device 0 actor ──done──> driver ──> main
//   main ──(result "embed")──> device 0 actor ──(found, sum)──> main
//
// Then it provokes each kind of error a reply can carry and checks that the
// reply is that kind: invalid_argument (an unknown kernel), cancelled (work
// cancelled while it waits behind another device), device_failed with the
// failure's provenance (a kernel that throws), and CAF's own error (a request
// to a device actor whose backend is gone). Every line it prints starts with
// "ok" or "WRONG"; the exit status is 0 only when every reply was right.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>

#include "embed_driver.hpp" // the driver actor: every step handles its error

using namespace multidev;
using namespace multidev::atoms;

namespace {

/// Bounds every request, so that a reply that never comes is a wrong reply
/// (`caf::sec::request_timeout`) instead of a hang.
constexpr auto reply_timeout = std::chrono::seconds(30);

/// The kind of error a device actor's reply carries, told apart as
/// docs/embedding.md's "Errors" does.
std::string kind_of(const caf::error& err) {
  if (err.category() != error_category)
    return "caf"; // CAF's own, e.g. caf::sec::request_receiver_down: the actor is gone
  switch (static_cast<errc>(err.code())) {
    case errc::invalid_argument:
      return "invalid_argument"; // a bad request: nothing was scheduled
    case errc::device_failed:
      return "device_failed"; // failure_of(err) says where it started
    case errc::cancelled:
      return "cancelled";
  }
  return "unknown multidev error";
}

} // namespace

int main(int argc, char** argv) {
  // The configuration of docs/embedding.md: the protocol's types, CAF's
  // work-sharing scheduler (idle workers sleep instead of polling), two
  // workers. Parsed after, so a command line can override each value.
  caf::actor_system_config cfg;
  register_types(cfg);
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{2});
  if (auto err = cfg.parse(argc, argv)) {
    std::fprintf(stderr, "bad options: %s\n", caf::to_string(err).c_str());
    return 2;
  }
  caf::actor_system sys{cfg};

  int wrong = 0;
  auto check = [&](bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "ok   " : "WRONG", what.c_str());
    wrong += ok ? 0 : 1;
  };
  auto unexpected = [&](const std::string& step) {
    return [&, step](caf::error& e) { check(false, step + ": " + describe_error(sys, e)); };
  };

  device_actor gone; // device 0's actor, asked once its backend is destroyed
  {
    backend b{sys, backend_options{.num_devices = 2}};
    auto d0 = b.get_device(0), d1 = b.get_device(1);
    device_actor dev0 = device_actor_of(b, d0), dev1 = device_actor_of(b, d1);
    constexpr uint64_t n = 1024;
    b.alloc_pool(d0, 1, n * sizeof(float), 64);
    caf::scoped_actor self{sys};

    // Schedule a named kernel, wait for it, read its result.
    auto drv = sys.spawn(embed::driver, dev0, n, "fill");
    self->request(drv, reply_timeout, schedule_atom::value)
      .receive(
        [&](uint64_t seq) { check(seq > 0, "driver actor: done at seq " + std::to_string(seq)); },
        unexpected("driver actor"));
    self->send_exit(drv, caf::exit_reason::user_shutdown);
    self->request(dev0, reply_timeout, result_atom::value, std::string{"embed"})
      .receive(
        [&](bool found, const kernel_result& r) {
          char line[96];
          std::snprintf(line, sizeof line, "result embed: sum %.1f over %zu floats", r.sum,
                        r.count);
          check(found && r.count == n && r.sum == 7.0 * n, line);
        },
        unexpected("result embed"));

    // invalid_argument: an unknown kernel. Nothing is scheduled.
    self->request(dev0, reply_timeout, schedule_atom::value, task_spec{"no_such_kernel", {}})
      .receive([&](uint64_t) { check(false, "no_such_kernel was scheduled"); },
               [&](caf::error& e) {
                 check(kind_of(e) == "invalid_argument",
                       "invalid_argument: " + describe_error(sys, e));
               });

    // cancelled: device 1 waits for device 0, which a host closure holds, so
    // the kernel sent to device 1 is still queued when the cancel arrives.
    std::promise<void> release;
    b.schedule_task(d0, {"held", [go = release.get_future().share()] { go.wait(); }});
    b.will_wait_for(b.make_context(d1), b.all_work(d0));
    uint64_t queued = 0;
    self->request(dev1, reply_timeout, schedule_atom::value, task_spec{"spin_ns", {int64_t{0}}})
      .receive([&](uint64_t seq) { queued = seq; }, unexpected("schedule spin_ns"));
    self->request(dev1, reply_timeout, cancel_atom::value)
      .receive(
        [&](uint64_t last) {
          check(queued > 0 && last >= queued, "cancel: up to seq " + std::to_string(last));
        },
        unexpected("cancel"));
    self->request(dev1, reply_timeout, wait_atom::value, queued)
      .receive([&](uint64_t) { check(false, "the cancelled spin_ns ran"); },
               [&](caf::error& e) {
                 check(kind_of(e) == "cancelled", "cancelled: " + describe_error(sys, e));
               });
    release.set_value();

    // device_failed: a kernel that throws fails device 1, and the error of
    // the wait carries the failure: the device, the seq, the message.
    uint64_t failing = 0;
    self
      ->request(dev1, reply_timeout, schedule_atom::value,
                task_spec{"fail", {std::string{"boom"}}})
      .receive([&](uint64_t seq) { failing = seq; }, unexpected("schedule fail"));
    self->request(dev1, reply_timeout, wait_atom::value, failing)
      .receive([&](uint64_t) { check(false, "the failing kernel succeeded"); },
               [&](caf::error& e) {
                 auto f = failure_of(e);
                 check(kind_of(e) == "device_failed" && f && f->device == b.get_name(d1)
                         && f->seq == failing && f->message == "boom",
                       "device_failed: " + describe_error(sys, e));
               });
    gone = dev0;
  } // ~backend: the devices and their actors stop here

  // CAF's own error: the actor is gone.
  {
    caf::scoped_actor self{sys};
    self->request(gone, reply_timeout, idle_atom::value)
      .receive(
        [&](bool) { check(false, "a device actor answered after its backend was destroyed"); },
        [&](caf::error& e) { check(kind_of(e) == "caf", "CAF's own: " + describe_error(sys, e)); });
  }
  if (wrong == 0)
    std::printf("embed: every reply as expected\n");
  else
    std::printf("embed: %d wrong replies\n", wrong);
  return wrong == 0 ? 0 : 1;
}
