// Test helpers for real processes: a free port on 127.0.0.1, the path of a binary among the
// test's runfiles, and ChildProcess, a program run by the test with its output in a file.
// Thread safety: a ChildProcess belongs to one thread; FreePort and RunfilePath are thread-safe.
#ifndef HGEMM_SERVER_TESTING_CHILD_PROCESS_H_
#define HGEMM_SERVER_TESTING_CHILD_PROCESS_H_

#include <signal.h>
#include <sys/types.h>

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
  // What it wrote so far.
  std::string Output() const;

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;  // once reaped
  std::string output_path_;
};

}  // namespace hgemm::subprocess

#endif  // HGEMM_SERVER_TESTING_CHILD_PROCESS_H_
