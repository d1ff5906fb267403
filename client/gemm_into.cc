#include "client/gemm_into.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>
#include <vector>

namespace hgemm {

GemmInto::GemmInto(const GemmClient& client, v1::GemmRequest request, OperandBytes operands,
                   CBuffer c_into, Mode mode, const CallOptions& options)
    : client_(client), request_(std::move(request)), operands_(operands), c_into_(c_into) {
  const bool regions = request_.has_a_region() || request_.has_b_region() ||
                       request_.has_c_in_region() || request_.has_c_region();
  if (regions || mode == Mode::kUnary) {
    route_ = request_.has_c_region() ? Route::kUnary : Route::kInPlace;
  } else if (mode == Mode::kStream) {
    route_ = Route::kStream;
  } else if (GemmClient::ShouldSendParts(request_, options, operands_)) {
    route_ = Route::kParts;
  } else if (GemmClient::ShouldStream(request_, options, operands_)) {
    route_ = Route::kStream;
  } else {
    route_ = request_.has_c_region() ? Route::kUnary : Route::kInPlace;
  }
  if (route_ != Route::kInPlace) {
    if (operands_.a != nullptr) request_.set_a(operands_.a, operands_.a_bytes);
    if (operands_.b != nullptr) request_.set_b(operands_.b, operands_.b_bytes);
    operands_ = {};
  }
}

grpc::Status GemmInto::Try(const CallOptions& options, v1::GemmResponse* response) const {
  switch (route_) {
    case Route::kInPlace:
      return client_.GemmInPlace(request_, operands_, c_into_, response, options);
    case Route::kStream: {
      std::vector<StreamedGemm> results;
      const std::vector<CBuffer> c_into = {c_into_};
      grpc::Status status = client_.GemmStream({&request_}, &results, options, &c_into);
      if (status.ok()) status = results[0].status;
      if (status.ok()) *response = std::move(results[0].response);
      return status;
    }
    case Route::kUnary:
    case Route::kParts:
      break;
  }
  grpc::Status status = route_ == Route::kParts ? client_.Run(request_, response, options)
                                                : client_.Gemm(request_, response, options);
  if (!status.ok() || request_.has_c_region()) return status;  // C is in the region
  const size_t c_bytes = GemmClient::ResultBytes(request_);
  if (response->c().size() != c_bytes || c_bytes > c_into_.capacity) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        fmt::format("the server sent {} bytes of C; {}x{} is {}",
                                    response->c().size(), request_.m(), request_.n(), c_bytes));
  }
  std::memcpy(c_into_.data, response->c().data(), c_bytes);
  response->clear_c();
  return status;
}

bool GemmInto::idempotent() const {
  return !(request_.has_c_region() && request_.has_c_in_region());
}

}  // namespace hgemm
