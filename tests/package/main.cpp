// Uses the installed multidev package: two devices, a task on each, the
// second after the first (will_wait_for), a copy between them, and the
// actor protocol header (a device's actor, and a flush through it).
#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include <cstdio>
#include <vector>

int main() {
  multidev::backend b{multidev::backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  int value = 0;
  b.schedule_task(d0, {"produce", [&] { value = 21; }});
  auto c1 = b.make_context(d1);
  b.will_wait_for(c1, b.all_work(d0));
  b.schedule_task(d1, {"consume", [&] { value *= 2; }});
  b.await(d1);

  multidev::tnode t{1, "x", 4 * sizeof(float), multidev::memory_mode::on_device};
  std::vector<float> in{1, 2, 3, 4}, out(4);
  auto c0 = b.init_from_host(b.make_context(d0), t, std::as_bytes(std::span{in}));
  c1 = b.init_from_device(t, c1, c0);
  b.to_host(c1, t, std::as_writable_bytes(std::span{out}));
  b.sync(b.all_work(d1));

  multidev::device_actor actor = multidev::device_actor_of(b, d0);
  b.flush(d0); // a round trip through that actor

  bool ok = value == 42 && out == in && actor;
  std::printf("multidev package: %s on %d devices: value %d, copy %s, actor %s\n",
              b.name().c_str(), b.num_devices(), value, out == in ? "ok" : "wrong",
              actor ? "ok" : "missing");
  return ok ? 0 : 1;
}
