// Embedding: a backend on an actor system the program already owns, and a
// user actor that drives a device by message (schedule a named kernel, then
// wait for its seq), while the host reads the result through the backend.
//
//   host ──alloc──> backend ──> device 0 actor
//   driver actor ──(schedule fill)──> device 0 actor ──seq──> driver
//   driver actor ──(wait seq)───────> device 0 actor ──done──> driver ──> host
//
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include <cstdio>

#include "embed_driver.hpp" // the driver actor: every step handles its error

using namespace multidev;

int main(int argc, char** argv) {
  caf::actor_system_config cfg;
  register_types(cfg);
  cfg.set("scheduler.max-threads", size_t{2});
  if (auto err = cfg.parse(argc, argv)) {
    std::fprintf(stderr, "bad options: %s\n", caf::to_string(err).c_str());
    return 2;
  }
  caf::actor_system sys{cfg};
  int status = 1;
  {
    backend b{sys, backend_options{.num_devices = 2}};
    auto d = b.get_device(0);
    constexpr uint64_t n = 1024;
    b.alloc_pool(d, 1, n * sizeof(float), 64);
    auto drv = sys.spawn(embed::driver, device_actor_of(b, d), n, "fill");
    caf::scoped_actor self{sys};
    self->request(drv, caf::infinite, atoms::schedule_atom::value)
      .receive(
        [&](uint64_t seq) {
          auto r = b.result("embed");
          std::printf("driver actor: done at seq %llu, sum %.1f over %zu floats\n",
                      static_cast<unsigned long long>(seq), r ? r->sum : -1.0,
                      r ? r->count : 0);
          status = r && r->sum == 7.0 * n ? 0 : 1;
        },
        [&](caf::error& e) { std::printf("error: %s\n", sys.render(e).c_str()); });
    self->send_exit(drv, caf::exit_reason::user_shutdown);
  } // the backend stops its devices and actors here
  return status;
}
