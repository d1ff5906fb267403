// FileWatch: a few files that are read at start and re-read on change (a rotated Kubernetes
// Secret, an edited tokens file). Each new version of their contents goes through `apply`,
// which checks it and takes it or says why not; a version refused after start leaves the last
// good one in force and is logged as an error (once per version).
//
// The files are polled (read and compared) every `period`: they are small, and polling sees
// every way a file can be replaced (rewritten, renamed over, a symlink swapped), as Kubernetes
// does with Secret volumes.
// Thread safety: `apply` runs on the caller's thread in Start, then on the watch's own thread;
// it is never called twice at once, and not after the destructor returns.
#ifndef HGEMM_SERVER_AUTH_FILE_WATCH_H_
#define HGEMM_SERVER_AUTH_FILE_WATCH_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace hgemm {

// Reads the whole file at `path` into *contents; false with *error "PATH: why" if it can't.
bool ReadWholeFile(const std::string& path, std::string* contents, std::string* error);

class FileWatch {
 public:
  // Takes the files' contents (in the order of `paths`): "" when accepted, else why not, naming
  // the file at fault.
  using Apply = std::function<std::string(const std::vector<std::string>& contents)>;

  // Reads `paths` and applies them now. nullptr with *error set if a file can't be read or
  // `apply` refuses the contents; else the watch, polling from here on.
  static std::unique_ptr<FileWatch> Start(std::vector<std::string> paths,
                                          std::chrono::milliseconds period, Apply apply,
                                          std::string* error);
  ~FileWatch();  // stops polling

  FileWatch(const FileWatch&) = delete;
  FileWatch& operator=(const FileWatch&) = delete;

 private:
  FileWatch(std::vector<std::string> paths, std::chrono::milliseconds period, Apply apply);
  // Reads the files and applies them if they differ from the last version seen: nothing if
  // they don't, else "" (applied) or why not (unreadable, refused).
  std::optional<std::string> Poll();
  void Run();

  const std::vector<std::string> paths_;
  const std::chrono::milliseconds period_;
  const Apply apply_;
  std::vector<std::string> seen_;  // the last version read (applied or refused); Poll's thread

  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_AUTH_FILE_WATCH_H_
