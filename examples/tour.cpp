// The API at a glance (quoted by docs/api.md): devices, tasks, events, pools,
// a node uploaded, transformed by a named kernel, copied and read back.
#include <multidev/multidev.hpp>

#include <cstdio>
#include <vector>

int main() {
  multidev::backend b{{.num_devices = 2}};              // or backend b{my_actor_system, opts}
  auto d = b.get_device(0);                             // memoized; bad ordinal: std::invalid_argument
  b.schedule_task(d, {"hello", [] { std::puts("on d's runner"); }});
  multidev::event e = b.all_work(d);                    // done when everything scheduled so far is
  b.will_wait_for(b.make_context(b.get_device(1)), e);  // device 1's later work waits for e
  b.sync(e);

  b.alloc_pool(d, /*pool_id*/ 100, /*bytes*/ 4096, /*alignment*/ 64);
  b.memset_zero(d, 100, 0, 4096);                       // ordered with d's tasks
  b.free_pool(d, 100);                                  // ordered too; unknown/double free: invalid_argument

  std::vector<float> host(1024, 1.5f), out(1024);
  multidev::tnode w{1, "w", host.size() * sizeof(float), multidev::memory_mode::on_device};
  auto ctx = b.init_from_host(b.make_context(d), w, std::as_bytes(std::span{host}));
  b.run(b.link(ctx, "scale", {w, 2.0}));                // a named kernel; ordered after w's writers
  auto ctx1 = b.init_from_device(w, b.make_context(b.get_device(1)), ctx);
  b.to_host(ctx1, w, std::as_writable_bytes(std::span{out}));
  b.sync(b.all_work(ctx1.device));
  std::printf("w[0] = %.1f on %s\n", out[0], b.get_name(ctx1.device).c_str());
  return out[0] == 3.0f ? 0 : 1;
}
