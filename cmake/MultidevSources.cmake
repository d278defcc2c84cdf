# The library's sources, relative to the source root: the main build's
# `multidev` target, and the fuzz build's instrumented copy of it
# (fuzz/CMakeLists.txt), which compiles the same files with clang.
# cuda_runtime_hook.cpp: where the CUDA driver finds the runtime layer, when
# the program links it.
set(MULTIDEV_LIBRARY_SOURCES
  messages/sexp.cpp
  messages/types.cpp
  messages/task.cpp
  messages/protocol.cpp
  messages/trace.cpp
  messages/timeline.cpp
  messages/timeline_svg.cpp
  devices/kernels.cpp
  devices/cpu/cpu_driver.cpp
  devices/fake/fake_driver.cpp
  devices/cuda/cuda_driver.cpp
  devices/cuda/fake_cuda_api.cpp
  devices/registry.cpp
  actors/core/device_core.cpp
  actors/core/bulk_push.cpp
  actors/core/device_queue.cpp
  actors/core/extra_cache.cpp
  actors/core/device_runner.cpp
  actors/core/stream_runner.cpp
  actors/core/stream_window.cpp
  actors/core/device_gates.cpp
  actors/core/gate_waiters.cpp
  actors/core/device_events.cpp
  actors/core/outcome_board.cpp
  actors/core/device_pools.cpp
  actors/core/pool_table.cpp
  actors/core/device_debug.cpp
  actors/core/device_trace.cpp
  actors/wait_graph.cpp
  actors/core/trace.cpp
  actors/trace_file.cpp
  actors/core/result_board.cpp
  actors/binding.cpp
  actors/round.cpp
  actors/device_actor.cpp
  actors/endpoint.cpp
  actors/remote/endpoint_remote.cpp
  actors/backend.cpp
  actors/backend_impl.cpp
  actors/reaper.cpp
  actors/handles.cpp
  actors/printers.cpp
  actors/transfers.cpp
  actors/remote/node.cpp
  actors/remote/node_rounds.cpp
  actors/remote/tls_middleman.cpp
  actors/remote/node_listener.cpp
  actors/remote/reply_sink.cpp
  actors/remote/cookie.cpp
  actors/remote/message_checks.cpp
  actors/core/backstop.cpp
  devices/cuda/cuda_runtime_hook.cpp)
