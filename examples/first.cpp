// A producer and a consumer on two devices, joined by will_wait_for:
//
//   device 0:  [produce] ──event──┐
//   device 1:                     └──> [consume]
//
#include <multidev/multidev.hpp>
#include <cstdio>

int main() {
  multidev::backend b{multidev::backend_options{.num_devices = 2}};
  auto producer = b.get_device(0), consumer = b.get_device(1);
  int value = 0;
  b.schedule_task(producer, {"produce", [&] { value = 42; }});
  b.will_wait_for(b.make_context(consumer), b.all_work(producer));
  b.schedule_task(consumer, {"consume", [&] { std::printf("consumed %d\n", value); }});
  b.await(consumer);
}
