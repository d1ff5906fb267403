#include "client/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hgemm {

std::unique_ptr<SharedRegion> SharedRegion::Create(int64_t bytes, std::string* error) {
  auto fail = [&](const char* call) {
    *error = std::string("shared region: ") + call + ": " + strerror(errno);
    return nullptr;
  };
  if (bytes <= 0) {
    *error = "shared region: its size must be at least 1 byte";
    return nullptr;
  }
  const int fd = memfd_create("hgemm_region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return fail("memfd_create");
  // Sized and allocated first (the server refuses holes: its touch of them would allocate
  // memory on the server's account), then sealed: from here on the file can grow, never shrink.
  if (const int e = posix_fallocate(fd, 0, bytes); e != 0) {
    errno = e;
    std::unique_ptr<SharedRegion> none = fail("posix_fallocate");
    close(fd);
    return none;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    std::unique_ptr<SharedRegion> none = fail("F_ADD_SEALS");
    close(fd);
    return none;
  }
  void* data = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    std::unique_ptr<SharedRegion> none = fail("mmap");
    close(fd);
    return none;
  }
  return std::unique_ptr<SharedRegion>(new SharedRegion(fd, static_cast<uint8_t*>(data), bytes));
}

SharedRegion::~SharedRegion() {
  munmap(data_, size_t(bytes_));
  close(fd_);
}

std::string SharedRegion::path() const {
  return "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd_);
}

}  // namespace hgemm
