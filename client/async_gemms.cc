#include "client/async_gemms.h"

#include <utility>

namespace hgemm {

void AsyncGemms::Start(const GemmClient& client, v1::GemmRequest request, OperandBytes operands,
                       CBuffer c_into, GemmInto::Mode mode, const CallOptions& options,
                       std::shared_ptr<grpc::ClientContext> context, Done done) {
  const bool keep_c = request.keep_c_resident();
  const bool streamed =
      mode == GemmInto::Mode::kStream ||
      (mode == GemmInto::Mode::kAuto && GemmClient::ShouldStream(request, options, operands));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++running_;
  }
  // Counted out when the completion, which holds it, is destroyed.
  auto running = std::shared_ptr<void>(nullptr, [this](void*) {
    std::lock_guard<std::mutex> lock(mu_);
    if (--running_ == 0) idle_.notify_all();
  });
  auto finish = [keep_c, streamed, done = std::move(done), running = std::move(running)](
                    grpc::Status status, v1::GemmResponse response) {
    if (status.ok() && keep_c && !response.has_c_matrix()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL,
                            "the server kept no C (keep_c_resident ignored?)");
    }
    done(status, response, streamed);
  };
  client.GemmAsync(std::move(request), operands, streamed, c_into, options, std::move(context),
                   std::move(finish));
}

void AsyncGemms::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return running_ == 0; });
}

}  // namespace hgemm
