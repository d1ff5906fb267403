#include "server/transport/status_util.h"

#include <string>

#include "google/rpc/error_details.pb.h"
#include "server/core/status.h"

namespace hgemm {

google::rpc::Status ToRpcStatus(const absl::Status& s) {
  const status::Details details = status::DetailsOf(s);
  google::rpc::Status out;
  out.set_code(int(s.code()));
  out.set_message(std::string(s.message()));
  google::rpc::ErrorInfo info;
  info.set_reason(details.reason.empty() ? status::CodeName(s.code()) : details.reason);
  info.set_domain(kErrorDomain);
  out.add_details()->PackFrom(info);
  if (!details.field.empty()) {
    google::rpc::BadRequest bad;
    google::rpc::BadRequest::FieldViolation* violation = bad.add_field_violations();
    violation->set_field(details.field);
    violation->set_description(details.field_problem);
    out.add_details()->PackFrom(bad);
  }
  if (!details.limit.empty()) {
    google::rpc::QuotaFailure quota;
    google::rpc::QuotaFailure::Violation* violation = quota.add_violations();
    violation->set_subject(details.limit);
    violation->set_description(std::string(s.message()));
    out.add_details()->PackFrom(quota);
  }
  if (details.retry_delay) {
    google::rpc::RetryInfo retry;
    const int64_t ms = details.retry_delay->count();
    retry.mutable_retry_delay()->set_seconds(ms / 1000);
    retry.mutable_retry_delay()->set_nanos(int32_t(ms % 1000) * 1000000);
    out.add_details()->PackFrom(retry);
  }
  return out;
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
                      ToRpcStatus(s).SerializeAsString());
}

}  // namespace hgemm
