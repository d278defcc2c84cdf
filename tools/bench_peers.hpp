#pragma once
// Peer baselines for `multidev bench`: the same small cases run on oneTBB's
// flow graph and on StarPU. Each function returns one sample (the bench takes
// medians of alternating repetitions); only submission and completion are
// timed unless a function's comment says otherwise. Plain C++: no oneTBB or
// StarPU header here, so the bench builds the same with or without them.

namespace multidev::tools::peers {

/// Whether this build has the peer (set by the build: MULTIDEV_HAVE_TBB /
/// MULTIDEV_HAVE_STARPU). Without it, that peer's functions throw
/// std::logic_error.
bool have_tbb() noexcept;
bool have_starpu() noexcept;

/// The most CPU workers this StarPU build runs (its STARPU_MAXCPUS, fixed
/// when StarPU was configured: 4 in Debian's and Ubuntu's libstarpu 1.3);
/// 0 without StarPU. The StarPU functions throw std::invalid_argument above
/// it rather than run with fewer workers than asked.
int starpu_max_workers() noexcept;

/// Case 1, independent tasks on one worker: `n` empty messages pushed from
/// this thread through a oneTBB flow graph serial function_node (concurrency
/// 1) in an arena of one worker thread, then wait_for_all; ns per task. The
/// arena, graph and node are built per call, outside the timing.
double tbb_ns_per_task(int n);

/// Case 1 with StarPU: `n` empty CPU tasks (a codelet with no buffers whose
/// cpu function does nothing) submitted from this thread with one CPU worker,
/// then starpu_task_wait_for_all; ns per task. Task creation is timed (it is
/// part of submitting); StarPU's (re)initialization is not.
double starpu_ns_per_task(int n);

/// Case 2, dependency chain: two serial function_nodes (concurrency 1), each
/// sending to the other via make_edge, one message bounced `hops` times in
/// all, in an arena of 2 threads (this thread, which joins in wait_for_all,
/// and one worker); ns per hop. The last hop unlinks the nodes so the message
/// stops. Built per call, outside the timing.
double tbb_ns_per_hop(int hops);

/// Case 2 with StarPU: a chain of `hops` empty tasks each accessing one
/// registered handle (a small vector) in STARPU_RW, on 2 CPU workers,
/// submitted up front then waited for; ns per hop. Registration and
/// unregistration are outside the timing.
double starpu_ns_per_hop(int hops);

/// Case 3, fan-out/fan-in DAG on `workers` workers: `rounds` rounds, each a
/// source task, `width` empty tasks that each depend on the source, and a
/// sink depending on all `width`; a round's source depends on the previous
/// round's sink. Microseconds per round.
/// oneTBB: one round's graph of continue_nodes (source -> width -> sink),
/// built once per call outside the timing, then per round a try_put to the
/// source and wait_for_all, in a task_arena of `workers` threads (this thread
/// is one of them). See the definition for why this variant over building
/// all rounds up front.
double tbb_fan_dag_us(int workers, int width, int rounds);

/// StarPU: the same DAG with explicit dependencies
/// (starpu_task_declare_deps_array), every round's tasks created and
/// submitted up front from this thread, on `workers` CPU workers, then waited
/// for; task creation and dependency declaration are timed.
double starpu_fan_dag_us(int workers, int width, int rounds);

} // namespace multidev::tools::peers
