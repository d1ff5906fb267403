#include "client/error_details.h"

#include <iterator>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace hgemm {

ErrorDetails ErrorDetailsOf(const grpc::Status& status) {
  ErrorDetails out;
  google::rpc::Status rpc;
  if (status.ok() || status.error_details().empty() ||
      !rpc.ParseFromString(status.error_details())) {
    return out;
  }
  for (const google::protobuf::Any& detail : rpc.details()) {
    if (google::rpc::ErrorInfo info; detail.UnpackTo(&info)) {
      out.reason = info.reason();
      out.domain = info.domain();
    } else if (google::rpc::BadRequest bad; detail.UnpackTo(&bad)) {
      for (const auto& v : bad.field_violations()) {
        out.field_violations.push_back({v.field(), v.description()});
      }
    } else if (google::rpc::QuotaFailure quota; detail.UnpackTo(&quota)) {
      for (const auto& v : quota.violations()) {
        out.quota_violations.push_back({v.subject(), v.description()});
      }
    } else if (google::rpc::RetryInfo retry; detail.UnpackTo(&retry)) {
      out.retry_delay = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::seconds(retry.retry_delay().seconds()) +
          std::chrono::nanoseconds(retry.retry_delay().nanos()));
    }
  }
  return out;
}

grpc::Status StatusOf(const v1::GemmDone& done) {
  const auto code = static_cast<grpc::StatusCode>(done.status_code());
  if (!done.has_status()) return grpc::Status(code, done.status_message());
  return grpc::Status(code, done.status_message(), done.status().SerializeAsString());
}

const char* StatusCodeName(int code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  return code >= 0 && code < int(std::size(kNames)) ? kNames[code] : "UNKNOWN";
}

}  // namespace hgemm
