// Memfds as a same-host client makes them, for the shared-memory tests. Test-only.
#ifndef HGEMM_SERVER_TESTING_MEMFD_H_
#define HGEMM_SERVER_TESTING_MEMFD_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace hgemm {

// A memfd of `bytes` of this process, sealed against shrinking unless `seal_shrink` is false;
// closed on destruction. fd() is -1 if it could not be made.
class TestMemfd {
 public:
  explicit TestMemfd(int64_t bytes, bool seal_shrink = true) {
    fd_ = memfd_create("hgemm_test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd_ >= 0 && (ftruncate(fd_, bytes) != 0 ||
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

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_MEMFD_H_
