// The dependency chain of `will_wait_for_chain` (bench case 2), for counting
// what a hop executes under callgrind (scripts/count-hop-costs.sh): `hops`
// empty tasks alternating between two devices, each waiting for the one
// before through will_wait_for, scheduled while device 0 is held, then run.
// The scheduling is in `schedule_chain` and the running on the runner
// threads (`device_runner::run`), so that callgrind can collect either alone.
//
//   hop_costs HOPS REPS
#include <multidev/multidev.hpp>

#include <atomic>
#include <iostream>
#include <memory>
#include <string>

namespace {

using namespace multidev;

[[gnu::noinline]] event schedule_chain(backend& b, const context (&ctx)[2], event last,
                                       int hops) {
  for (int i = 1; i <= hops; ++i) {
    const auto& c = ctx[i % 2];
    b.will_wait_for(c, last);
    b.schedule_task(c.device, task{{}, [] {}, {}});
    last = b.all_work(c.device);
  }
  return last;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: hop_costs HOPS REPS\n";
    return 2;
  }
  int hops = std::stoi(argv[1]);
  int reps = std::stoi(argv[2]);
  backend_options o;
  o.num_devices = 2;
  backend b(o);
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  const context ctx[2] = {b.make_context(d0), b.make_context(d1)};
  for (int rep = 0; rep < reps; ++rep) {
    auto go = std::make_shared<std::atomic<bool>>(false);
    b.schedule_task(d0, task{{}, [go] { go->wait(false); }, {}});
    auto last = schedule_chain(b, ctx, b.all_work(d0), hops);
    go->store(true);
    go->notify_one();
    b.sync(last);
  }
  return 0;
}
