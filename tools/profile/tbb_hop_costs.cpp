// oneTBB's two-node ping-pong of bench case 2 (`tools::peers::tbb_ns_per_hop`,
// the bench's own), for counting what its hop executes under callgrind
// (scripts/count-hop-costs.sh).
//
//   tbb_hop_costs HOPS
#include <iostream>
#include <string>

#include "bench_peers.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tbb_hop_costs HOPS\n";
    return 2;
  }
  multidev::tools::peers::tbb_ns_per_hop(std::stoi(argv[1]));
  return 0;
}
