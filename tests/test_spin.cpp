// How runners decide to poll briefly: the CPUs they may use are those of
// the process's affinity mask (taskset, a container's cpuset), not the
// machine's count, so a runtime confined to fewer CPUs than the machine has
// polls as a crowded one must.
#define BOOST_TEST_MODULE test_spin
#include <boost/test/unit_test.hpp>

#include <sched.h>

#include <thread>

#include "actors/spin.hpp"

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
