#include "server/auth/file_watch.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace hgemm {

bool ReadWholeFile(const std::string& path, std::string* contents, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot open: " + std::strerror(errno);
    return false;
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) {
    *error = path + ": cannot read";
    return false;
  }
  *contents = std::move(bytes).str();
  return true;
}

FileWatch::FileWatch(std::vector<std::string> paths, std::chrono::milliseconds period, Apply apply)
    : paths_(std::move(paths)), period_(period), apply_(std::move(apply)) {}

std::unique_ptr<FileWatch> FileWatch::Start(std::vector<std::string> paths,
                                            std::chrono::milliseconds period, Apply apply,
                                            std::string* error) {
  std::unique_ptr<FileWatch> watch(new FileWatch(std::move(paths), period, std::move(apply)));
  if (std::optional<std::string> e = watch->Poll(); e && !e->empty()) {
    *error = *e;
    return nullptr;
  }
  watch->thread_ = std::thread([w = watch.get()] { w->Run(); });
  return watch;
}

FileWatch::~FileWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::optional<std::string> FileWatch::Poll() {
  std::vector<std::string> contents(paths_.size());
  for (size_t i = 0; i < paths_.size(); ++i) {
    std::string error;
    if (!ReadWholeFile(paths_[i], &contents[i], &error)) return error;
  }
  if (contents == seen_) return std::nullopt;
  seen_ = contents;
  return apply_(contents);
}

void FileWatch::Run() {
  std::string logged;  // the error logged last: a file that stays broken is reported once
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, period_, [this] { return stopping_; })) {
    lock.unlock();
    if (std::optional<std::string> outcome = Poll(); outcome) {
      if (!outcome->empty() && *outcome != logged) {
        spdlog::error("{}; the last good version stays in force", *outcome);
      }
      logged = *outcome;
    }
    lock.lock();
  }
}

}  // namespace hgemm
