#include "server/testing/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace hgemm::subprocess {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string RunfilePath(const std::string& path) {
  const char* root = std::getenv("TEST_SRCDIR");
  return std::string(root == nullptr ? "." : root) + "/hgemm_serve/" + path;
}

namespace {

// waitpid's status as Wait() reports it.
int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

ChildProcess::ChildProcess(const std::string& binary, const std::vector<std::string>& args) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(tmp == nullptr ? "/tmp" : tmp) + "/child_XXXXXX";
  const int out = mkstemp(pattern.data());
  output_path_ = pattern;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out, 1);
    dup2(out, 2);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(out);
}

ChildProcess::~ChildProcess() {
  Kill(SIGKILL);
  unlink(output_path_.c_str());
}

void ChildProcess::Kill(int signal) {
  if (pid_ <= 0 || exit_code_ >= 0) return;
  kill(pid_, signal);
  Wait();
}

int ChildProcess::Wait() {
  if (pid_ <= 0) return -1;
  if (exit_code_ >= 0) return exit_code_;
  int status = 0;
  if (waitpid(pid_, &status, 0) != pid_) return -1;
  exit_code_ = ExitCode(status);
  return exit_code_;
}

bool ChildProcess::Running() {
  if (pid_ <= 0 || exit_code_ >= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return true;
  exit_code_ = ExitCode(status);
  return false;
}

std::string ChildProcess::Output() const {
  std::ifstream in(output_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

namespace {

std::string ServerBinary() {
  const char* binary = std::getenv("HGEMM_SERVER_BINARY");
  return binary != nullptr ? binary : RunfilePath("server/hgemm_server");
}

std::vector<std::string> WithListen(std::vector<std::string> flags, const std::string& address) {
  flags.push_back("--listen=" + address);
  return flags;
}

// True if a TCP connection to 127.0.0.1:`port` is accepted.
bool Accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return connected;
}

}  // namespace

ServerProcess::ServerProcess(const std::vector<std::string>& flags, int port)
    : port_(port),
      address_("127.0.0.1:" + std::to_string(port)),
      process_(ServerBinary(), WithListen(flags, address_)) {}

bool ServerProcess::WaitUntilListening(std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Accepts(port_)) return true;
    if (!process_.Running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace hgemm::subprocess
