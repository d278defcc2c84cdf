// Runner pinning (`backend_options::pin_runners`, on by default): in a
// backend of two devices or more, each device's runner thread pins itself
// to one CPU of the process's affinity mask, the mask's CPUs taken in turn,
// so two runners that wait for each other do not end up sharing one CPU
// while another idles. Each device's
// debug info says where its runner runs (`cpu`).
#define BOOST_TEST_MODULE pinning
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "test_support.hpp"

#include <sched.h>

#include <set>
#include <string>
#include <vector>

using namespace multidev;
using test_support::field_of;
using test_support::sync;

namespace {

int process_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  BOOST_TEST_REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  return CPU_COUNT(&set);
}

/// Where `d`'s runner runs: the CPU a task on it ran on, and how many CPUs
/// its thread's affinity mask allows.
struct runner_place {
  int cpu = -1;
  int allowed = 0;
};

runner_place place_of(backend& b, const device& d) {
  runner_place p;
  b.schedule_task(d, {"where", [&p] {
                        p.cpu = sched_getcpu();
                        cpu_set_t set;
                        CPU_ZERO(&set);
                        if (sched_getaffinity(0, sizeof set, &set) == 0)
                          p.allowed = CPU_COUNT(&set);
                      }});
  sync(b, b.all_work(d));
  return p;
}

} // namespace

BOOST_AUTO_TEST_CASE(test_pinning_each_runner_on_its_own_cpu) {
  const int cpus = process_cpus();
  const int n = std::min(cpus, 4);
  backend b{backend_options{.num_devices = n, .hand_over = false}};
  std::set<std::string> seen;
  for (int i = 0; i < n; ++i) {
    auto d = b.get_device(i);
    auto p = place_of(b, d);
    auto field = field_of(b.get_debug_info(d), "cpu");
    if (cpus < 2) {
      BOOST_TEST(field == "any", "one CPU: nothing to spread");
      continue;
    }
    BOOST_TEST(p.allowed == 1, "device " << i << " runner may run on " << p.allowed << " CPUs");
    BOOST_TEST(field == std::to_string(p.cpu), "device " << i);
    // Still there a while later: pinned, not where it happened to be.
    for (int k = 0; k < 20; ++k)
      BOOST_TEST(place_of(b, d).cpu == p.cpu, "device " << i << ", task " << k);
    seen.insert(field);
  }
  if (cpus >= 2)
    BOOST_TEST(static_cast<int>(seen.size()) == n, n << " runners on " << seen.size() << " CPUs");
  else
    BOOST_TEST_MESSAGE("one CPU in this process's mask: pinning is off, as documented");
}

BOOST_AUTO_TEST_CASE(test_pinning_a_backend_of_one_device_does_not_pin) {
  const int cpus = process_cpus();
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  BOOST_TEST(place_of(b, d).allowed == cpus);
  BOOST_TEST(field_of(b.get_debug_info(d), "cpu") == "any");
}

BOOST_AUTO_TEST_CASE(test_pinning_off_leaves_each_runner_the_whole_mask) {
  const int cpus = process_cpus();
  backend b{backend_options{.num_devices = 2, .hand_over = false, .pin_runners = false}};
  for (int i = 0; i < 2; ++i) {
    auto d = b.get_device(i);
    BOOST_TEST(place_of(b, d).allowed == cpus, "device " << i);
    BOOST_TEST(field_of(b.get_debug_info(d), "cpu") == "any", "device " << i);
  }
}
