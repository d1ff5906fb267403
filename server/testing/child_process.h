// Test helpers for real processes: a free port on 127.0.0.1, the path of a binary among the
// test's runfiles, ChildProcess, a program run by the test with its output in a file, and
// ServerProcess, hgemm_server run by the test on a free port.
// Thread safety: a ChildProcess or ServerProcess belongs to one thread; FreePort and RunfilePath
// are thread-safe.
#ifndef HGEMM_SERVER_TESTING_CHILD_PROCESS_H_
#define HGEMM_SERVER_TESTING_CHILD_PROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace hgemm::subprocess {

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick for port 0).
int FreePort();

// `path` (e.g. "server/hgemm_server") inside the test's runfiles ($TEST_SRCDIR).
std::string RunfilePath(const std::string& path);

class ChildProcess {
 public:
  // Starts `binary` with `args` (argv[1..]); stdout and stderr go to a temporary file.
  ChildProcess(const std::string& binary, const std::vector<std::string>& args);
  ~ChildProcess();  // Kill(SIGKILL) if still running; removes the output file
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Sends `signal` and waits for the exit. No-op once it has exited.
  void Kill(int signal = SIGKILL);
  // Waits for the exit; returns the exit code, or 128 + the signal that ended it.
  int Wait();
  // False once it has exited (reaped then, without waiting).
  bool Running();
  // What it wrote so far.
  std::string Output() const;

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;  // once reaped
  std::string output_path_;
};

// hgemm_server listening on 127.0.0.1:`port` (a free one unless given) with `flags` besides that
// --listen (more --listen flags add addresses). The binary is $HGEMM_SERVER_BINARY when set
// (tests run outside Bazel, tools/gpu_e2e.sh), else the runfile server/hgemm_server: a test
// using it has `data = ["//server:hgemm_server"]`.
class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& flags, int port = FreePort());

  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  ChildProcess& process() { return process_; }
  // True once the server accepts connections on address(); false if it exits first or
  // `timeout` passes (its output says why).
  bool WaitUntilListening(std::chrono::seconds timeout = std::chrono::seconds(60));

 private:
  const int port_;
  const std::string address_;
  ChildProcess process_;
};

}  // namespace hgemm::subprocess

#endif  // HGEMM_SERVER_TESTING_CHILD_PROCESS_H_
