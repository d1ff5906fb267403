// Memfds as a same-host client makes them, for the shared-memory tests. Test-only.
#ifndef HGEMM_SERVER_TESTING_MEMFD_H_
#define HGEMM_SERVER_TESTING_MEMFD_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "server/resident/region_store.h"

namespace hgemm {

// A memfd of `bytes` of this process, allocated (not sparse) unless `allocate` is false,
// sealed against shrinking unless `seal_shrink` is false; `flags` are memfd_create's beyond
// MFD_CLOEXEC | MFD_ALLOW_SEALING. Closed on destruction. fd() is -1 if it could not be made.
class TestMemfd {
 public:
  explicit TestMemfd(int64_t bytes, bool seal_shrink = true, bool allocate = true,
                     unsigned flags = 0) {
    fd_ = memfd_create("hgemm_test", MFD_CLOEXEC | MFD_ALLOW_SEALING | flags);
    if (fd_ >= 0 && ((allocate ? posix_fallocate(fd_, 0, bytes) : ftruncate(fd_, bytes)) != 0 ||
                     (seal_shrink && fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK) != 0))) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~TestMemfd() {
    if (fd_ >= 0) close(fd_);
  }
  TestMemfd(const TestMemfd&) = delete;
  TestMemfd& operator=(const TestMemfd&) = delete;

  int fd() const { return fd_; }
  // The name a client registers it by.
  std::string path() const {
    return "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd_);
  }

 private:
  int fd_ = -1;
};

// A child process holding a sealed, allocated memfd of 4096 bytes that starts with "secret":
// what another client must never be able to register. Killed and reaped on destruction.
// pid() is -1 if the child could not be made.
class OtherProcessMemfd {
 public:
  OtherProcessMemfd() {
    int ready[2];
    if (pipe(ready) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {  // only async-signal-safe calls from here: the parent may have threads
      const int fd = memfd_create("hgemm_secret", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      const char text[] = "secret";
      if (fd < 0 || posix_fallocate(fd, 0, 4096) != 0 ||
          fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 ||
          pwrite(fd, text, sizeof(text), 0) != ssize_t(sizeof(text)) ||
          write(ready[1], &fd, sizeof(fd)) != ssize_t(sizeof(fd))) {
        _exit(1);
      }
      pause();
      _exit(0);
    }
    close(ready[1]);
    if (pid_ > 0 && read(ready[0], &fd_, sizeof(fd_)) != ssize_t(sizeof(fd_))) fd_ = -1;
    close(ready[0]);
  }
  ~OtherProcessMemfd() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  OtherProcessMemfd(const OtherProcessMemfd&) = delete;
  OtherProcessMemfd& operator=(const OtherProcessMemfd&) = delete;

  pid_t pid() const { return pid_; }
  int fd() const { return fd_; }
  // /proc/<child>/fd/<its memfd, or that plus `past`: a descriptor it does not have>.
  std::string path(int past = 0) const {
    return "/proc/" + std::to_string(pid_) + "/fd/" + std::to_string(fd_ + past);
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

// This process as a registering client (RegionStore::Register): its own memfds pass.
inline RegisteringProcess ThisProcess() {
  return {.pid = getpid(), .alive = [] { return true; }};
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_MEMFD_H_
