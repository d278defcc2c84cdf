// oneTBB's two-node ping-pong of bench case 2 (tools/bench_peers.cpp,
// `tbb_ns_per_hop`), for counting what its hop executes under callgrind
// (scripts/count-hop-costs.sh).
//
//   tbb_hop_costs HOPS
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <iostream>
#include <optional>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tbb_hop_costs HOPS\n";
    return 2;
  }
  namespace flow = oneapi::tbb::flow;
  int hops = std::stoi(argv[1]);
  oneapi::tbb::global_control threads(oneapi::tbb::global_control::max_allowed_parallelism, 2);
  oneapi::tbb::task_arena arena(2);
  using hop_node = flow::function_node<int, int>;
  std::optional<flow::graph> g;
  std::optional<hop_node> a, b;
  auto body = [&a, &b](int left) {
    if (left == 1) {
      flow::remove_edge(*a, *b);
      flow::remove_edge(*b, *a);
    }
    return left - 1;
  };
  arena.execute([&] {
    g.emplace();
    a.emplace(*g, flow::serial, body);
    b.emplace(*g, flow::serial, body);
    flow::make_edge(*a, *b);
    flow::make_edge(*b, *a);
  });
  a->try_put(hops);
  g->wait_for_all();
  return 0;
}
