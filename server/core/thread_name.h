// NameThisThread: the name the kernel shows for the calling thread (`top -H`, `ps -L`,
// /proc/PID/task/TID/comm), so that an operator (or a benchmark reading /proc) can tell the
// server's threads apart: slot workers, ring threads, bulk lanes, upload workers.
// Thread safety: names the calling thread only.
#ifndef HGEMM_SERVER_CORE_THREAD_NAME_H_
#define HGEMM_SERVER_CORE_THREAD_NAME_H_

#include <pthread.h>

#include <string>

namespace hgemm {

// Linux keeps 15 bytes of a name; a longer one is cut there.
inline void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_CORE_THREAD_NAME_H_
