#pragma once
// A `multidev node` process started by this one (`multidev run
// --spawn-nodes`, the node tests): started on port 0 (or one given), its address read from
// its "listening on ADDR:PORT" line, stopped and reaped when destroyed.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace multidev::scenario {

class node_process {
public:
  /// Starts `tool node --port PORT --cpu-devices N [--name NAME]` and waits
  /// (30 s at most) for its address; throws `std::runtime_error` otherwise.
  /// The node's stderr is kept aside (see `errors`) unless `keep_stderr`,
  /// which lets it through.
  /// `extra` goes after those arguments. The node is started with
  /// `--stop-with-parent`: should this process die without stopping it, the
  /// node stops too. `port` 0: one the system picks.
  node_process(const std::string& tool, int devices, const std::string& name,
               bool keep_stderr = false, const std::vector<std::string>& extra = {},
               uint16_t port = 0);
  /// SIGTERM, then SIGKILL after 10 s; reaps it.
  ~node_process();
  node_process(const node_process&) = delete;
  node_process& operator=(const node_process&) = delete;

  /// `kill -9`, and reaps it.
  void kill9();
  /// SIGSTOP, and returns once the node has stopped: it stays connected but
  /// falls silent, as behind a cut link (its peers find out by heartbeat);
  /// `resume` sends SIGCONT.
  void pause();
  void resume();
  /// SIGTERM; returns its exit status (128 + signal when killed; -1 when it
  /// did not exit within 30 s).
  int terminate();

  /// The last `max_bytes` the node wrote on its stderr, when kept aside.
  std::string errors(std::size_t max_bytes = 4096) const;
  /// Whether it was started and has not been reaped (killed, terminated).
  bool running() const noexcept { return pid_ > 0; }

  /// "ADDR:PORT".
  const std::string& address() const noexcept { return address_; }
  uint16_t port() const noexcept { return port_; }
  /// Its process id (-1 once reaped).
  pid_t pid() const noexcept { return pid_; }

private:
  pid_t pid_ = -1;
  int out_ = -1;
  int err_ = -1; // its stderr, kept aside: an unlinked temporary file
  std::string address_;
  uint16_t port_ = 0;
};

} // namespace multidev::scenario
