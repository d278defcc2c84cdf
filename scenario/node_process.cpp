#include "scenario/node_process.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace multidev::scenario {

using namespace std::chrono_literals;

node_process::node_process(const std::string& tool, int devices, const std::string& name,
                           bool keep_stderr, const std::vector<std::string>& extra,
                           uint16_t port) {
  std::vector<std::string> args{tool, "node", "--port", std::to_string(port), "--cpu-devices",
                                std::to_string(devices), "--stop-with-parent"};
  if (!name.empty()) {
    args.push_back("--name");
    args.push_back(name);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  if (pipe(out) != 0)
    throw std::runtime_error("starting node " + name + ": pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  // Its start and stop lines would mix into the caller's output: they go to
  // an unlinked temporary file, read back only if the caller asks
  // (`errors`, when the node exits badly).
  if (!keep_stderr) {
    char path[] = "/tmp/multidev-node-XXXXXX";
    err_ = mkostemp(path, O_CLOEXEC);
    if (err_ >= 0) {
      unlink(path);
      posix_spawn_file_actions_adddup2(&fa, err_, 2);
    } else {
      posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    }
  }
  int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    pid_ = -1;
    throw std::runtime_error(
      fmt::format("cannot start node {} ({}): {}", name, tool, std::strerror(rc)));
  }
  out_ = out[0];
  std::string line;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0)
      continue;
    char buf[256];
    auto got = read(out_, buf, sizeof buf);
    if (got <= 0)
      break;
    line.append(buf, static_cast<std::size_t>(got));
  }
  auto at = line.find("listening on ");
  auto colon = line.rfind(':', line.find('\n', at));
  if (at == std::string::npos || colon == std::string::npos || colon < at) {
    kill9();
    close(out_);
    out_ = -1;
    throw std::runtime_error(fmt::format("node {} did not start listening within 30 s", name));
  }
  address_ = line.substr(at + 13, line.find('\n', at) - at - 13);
  port_ = static_cast<uint16_t>(std::stoi(line.substr(colon + 1)));
}

node_process::~node_process() {
  if (pid_ > 0 && terminate() < 0)
    kill9();
  if (out_ >= 0)
    close(out_);
  if (err_ >= 0)
    close(err_);
}

std::string node_process::errors(std::size_t max_bytes) const {
  if (err_ < 0)
    return {};
  auto size = lseek(err_, 0, SEEK_END);
  if (size <= 0)
    return {};
  auto from = size > static_cast<off_t>(max_bytes) ? size - static_cast<off_t>(max_bytes) : 0;
  std::string text(static_cast<std::size_t>(size - from), '\0');
  auto got = pread(err_, text.data(), text.size(), from);
  text.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
  return text;
}

void node_process::kill9() {
  if (pid_ <= 0)
    return;
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

namespace {
/// Whether /proc says process `pid` is stopped (state T).
bool stopped_in_proc(pid_t pid) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/stat"};
  std::string text;
  std::getline(in, text);
  // "pid (comm) S ...": the state follows the last ')' (comm may hold any).
  auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'T';
}
} // namespace

void node_process::pause() {
  if (pid_ <= 0)
    return;
  ::kill(pid_, SIGSTOP);
  // Returns once it has stopped: a signal is delivered when the process is
  // next scheduled, and a request sent meanwhile (the run's next step, on a
  // loaded machine) would still be answered.
  // Bounded: the stop is reported to one waitpid only (a second SIGSTOP of a
  // stopped process reports nothing), so the process's own state in /proc
  // ends the wait too, and 10 s end it whatever happens.
  for (int i = 0; i < 10'000; ++i) {
    int status = 0;
    auto got = waitpid(pid_, &status, WUNTRACED | WNOHANG);
    if (got == pid_) {
      if (WIFEXITED(status) || WIFSIGNALED(status))
        pid_ = -1; // it had ended already: reaped
      return;
    }
    if (got == -1 && errno != EINTR)
      return; // not our child any more
    if (stopped_in_proc(pid_))
      return;
    std::this_thread::sleep_for(1ms);
  }
}

void node_process::resume() {
  if (pid_ > 0)
    ::kill(pid_, SIGCONT);
}

int node_process::terminate() {
  resume(); // a paused node cannot handle SIGTERM
  if (pid_ <= 0)
    return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 3000; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(10ms);
  }
  return -1;
}

} // namespace multidev::scenario
