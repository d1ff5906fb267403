#include "server/transport/call_services.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "server/core/logging.h"
#include "server/core/status.h"
#include "server/transport/convert.h"

namespace hgemm {

void CallLog::Answered(Rpc rpc, const absl::Status& s, const grpc::CallbackServerContext* context,
                       std::string_view caller, std::string_view request_id,
                       std::optional<uint64_t> gemm_id) const {
  if (metrics_ != nullptr) metrics_->CountCall(rpc, s.code());
  if (s.ok()) return;
  const std::string gemm = gemm_id ? std::to_string(*gemm_id) : "";
  const std::string code = status::CodeName(s.code());
  logging::Log(spdlog::level::info, fmt::format("{} {}", RpcName(rpc), code),
               {{"rpc", RpcName(rpc), false},
                {"code", code, false},
                {"gemm_id", gemm},
                {"reason", status::Message(s)},
                {"request_id", request_id},
                {"peer", context->peer()},
                {"principal", caller},
                {"traceparent", CallTraceparent(*context)}});
}

void CallLog::StreamEnded(const absl::Status& s, const grpc::CallbackServerContext* context,
                          std::string_view caller) const {
  if (metrics_ != nullptr) metrics_->CountStreamCall(s.code());
  if (s.ok()) return;
  const std::string code = status::CodeName(s.code());
  logging::Log(spdlog::level::info, fmt::format("GemmStream call {}", code),
               {{"rpc", "GemmStream", false},
                {"code", code, false},
                {"reason", status::Message(s)},
                {"peer", context->peer()},
                {"principal", caller},
                {"traceparent", CallTraceparent(*context)}});
}

void CallLog::Ran(const GemmShape& shape, const GemmResult& result) const {
  if (metrics_ != nullptr) metrics_->ObserveGemm(result.report, result.report.Tflops(shape));
}

void CallLog::Received(Rpc rpc, int64_t bytes, const grpc::ServerContextBase& context) const {
  if (metrics_ == nullptr) return;
  metrics_->AddReceivedBytes(rpc, bytes);
  metrics_->AddTransportBytes(OverUnixSocket(context) ? DataPath::kUnix : DataPath::kTcp,
                              /*sent=*/false, bytes);
}

void CallLog::Sent(Rpc rpc, int64_t bytes, const grpc::ServerContextBase& context) const {
  if (metrics_ == nullptr) return;
  metrics_->AddSentBytes(rpc, bytes);
  metrics_->AddTransportBytes(OverUnixSocket(context) ? DataPath::kUnix : DataPath::kTcp,
                              /*sent=*/true, bytes);
}

void CallLog::SharedMemory(int64_t received, int64_t sent) const {
  if (metrics_ == nullptr) return;
  metrics_->AddTransportBytes(DataPath::kShm, /*sent=*/false, received);
  metrics_->AddTransportBytes(DataPath::kShm, /*sent=*/true, sent);
}

void CallLog::RingEntry(absl::StatusCode code) const {
  if (metrics_ != nullptr) metrics_->CountRingEntry(code);
}

TrackedCalls::TrackedCalls(std::chrono::seconds idle_timeout)
    : idle_timeout_(idle_timeout), janitor_([this] { ExpireIdleCalls(); }) {}

TrackedCalls::~TrackedCalls() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  janitor_wake_.notify_all();
  janitor_.join();
}

void TrackedCalls::Track(TrackedCall* call) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.insert(call);
  if (draining_) call->Drain();
}

void TrackedCalls::Untrack(TrackedCall* call) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(call);
}

void TrackedCalls::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  for (TrackedCall* call : calls_) call->Drain();
}

void TrackedCalls::ExpireIdleCalls() {
  // A few looks per timeout: a call expires at most a quarter of it late.
  const auto period = std::clamp<Clock::duration>(idle_timeout_ / 4, std::chrono::milliseconds(10),
                                                  std::chrono::seconds(1));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    janitor_wake_.wait_for(lock, period);
    const Clock::time_point cutoff = Clock::now() - idle_timeout_;
    for (TrackedCall* call : calls_) call->ExpireIdle(cutoff);
  }
}

CallGate::Pass& CallGate::Pass::operator=(Pass&& other) noexcept {
  if (this != &other) {
    Leave();
    gate_ = std::exchange(other.gate_, nullptr);
  }
  return *this;
}

void CallGate::Pass::Leave() {
  CallGate* gate = std::exchange(gate_, nullptr);
  if (gate == nullptr) return;
  std::lock_guard<std::mutex> lock(gate->mu_);
  if (--gate->passes_ == 0) gate->passes_returned_.notify_all();
}

CallGate::Pass CallGate::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return Pass();
  ++passes_;
  return Pass(this);
}

void CallGate::Close() {
  std::unique_lock<std::mutex> lock(mu_);
  closed_ = true;
  passes_returned_.wait(lock, [this] { return passes_ == 0; });
}

void Describe(const GemmCoreInterface& core, const ResidentMatrix& matrix, v1::MatrixInfo* info) {
  ToProto(matrix, core.DeviceId(matrix), core.replica(), info);
}

}  // namespace hgemm
