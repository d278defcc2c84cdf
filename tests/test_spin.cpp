// How runners decide to poll briefly: the CPUs they may use are those of
// the process's affinity mask (taskset, a container's cpuset), not the
// machine's count, so a runtime confined to fewer CPUs than the machine has
// polls as a crowded one must; and a pinned runner is crowded only by the
// runners awake on its own CPU.
#define BOOST_TEST_MODULE test_spin
#include <boost/test/unit_test.hpp>

#include <sched.h>

#include <barrier>
#include <latch>
#include <thread>
#include <vector>

#include "actors/core/spin.hpp"

using multidev::detail::usable_cpus;

BOOST_AUTO_TEST_CASE(test_spin_usable_cpus_follow_the_affinity_mask) {
  cpu_set_t all;
  CPU_ZERO(&all);
  BOOST_TEST_REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
  BOOST_TEST(usable_cpus() == CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all))
    ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  BOOST_TEST_REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0); // this thread only
  auto confined = usable_cpus();
  sched_setaffinity(0, sizeof all, &all);
  BOOST_TEST(confined == 1);
  if (std::thread::hardware_concurrency() < 2)
    BOOST_TEST_MESSAGE("one CPU here: the mask and the machine agree, so this checks little");
}

BOOST_AUTO_TEST_CASE(test_spin_a_pinned_runner_is_crowded_only_by_runners_on_its_cpu) {
  // n + 1 runner threads pinned in turn over the mask's n CPUs: the first and
  // the last share a CPU, each of the others has one of its own. A runner
  // alone on its CPU polls its waits (runners_crowd_cpus false) however many
  // runners are awake elsewhere; until 2026-12-05 any other awake runner
  // made it sleep at once.
  namespace d = multidev::detail;
  const int n = d::process_cpus();
  if (n < 2) {
    BOOST_TEST_MESSAGE("skipped: one CPU in this process's mask, so nothing is pinned");
    return;
  }
  const int threads = n + 1;
  std::barrier step(threads + 1); // the runners and this thread
  std::vector<int> cpu(threads, -1);
  std::vector<char> crowded_awake(threads), crowded_after(threads);
  std::vector<std::jthread> runners;
  for (int i = 0; i < threads; ++i) {
    std::latch pinned{1};
    runners.emplace_back([&, i] {
      d::runner_awake counted;
      cpu[i] = d::pin_to_next_cpu();
      pinned.count_down();
      step.arrive_and_wait(); // 1: all pinned and awake
      crowded_awake[i] = d::runners_crowd_cpus();
      step.arrive_and_wait(); // 2: looked
      if (i == threads - 1) {
        d::runner_asleep asleep; // the last one sleeps: its CPU's first is alone
        step.arrive_and_wait(); // 3
        step.arrive_and_wait(); // 4: the others looked
      } else {
        step.arrive_and_wait(); // 3
        crowded_after[i] = d::runners_crowd_cpus();
        step.arrive_and_wait(); // 4
      }
    });
    pinned.wait(); // pinned in order: the i-th takes the mask's i-th CPU
  }
  for (int k = 0; k < 4; ++k)
    step.arrive_and_wait();
  runners.clear(); // joined
  BOOST_TEST_REQUIRE(cpu[0] >= 0);
  BOOST_TEST_REQUIRE(cpu[0] == cpu[threads - 1]);
  BOOST_TEST(crowded_awake[0] == 1, "the first runner shares its CPU with the last");
  BOOST_TEST(crowded_awake[threads - 1] == 1, "the last runner shares its CPU with the first");
  for (int i = 1; i < threads - 1; ++i)
    BOOST_TEST(crowded_awake[i] == 0, "runner " << i << " is alone on CPU " << cpu[i]);
  for (int i = 0; i < threads - 1; ++i)
    BOOST_TEST(crowded_after[i] == 0, "runner " << i << ", its CPU's other runner asleep");
}
