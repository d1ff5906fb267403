// ReflectionService: gRPC server reflection (grpc.reflection.v1alpha.ServerReflection) over the
// descriptors linked into the binary (DescriptorPool::generated_pool()).
//
// gRPC's own reflection plugin (libgrpc++_reflection 1.51) reuses one response message for all
// the requests of a stream, so the second answer on a stream still begins with the first
// answer's files: grpcurl, which asks for every listed service on one stream and reads the
// first file of each answer as the one holding the symbol, then fails ("Symbol not found").
// Here every answer is made afresh: the file holding the symbol first, then every file it
// imports, whatever the stream carried before.
// Thread safety: the service is stateless apart from its service list; any thread may call in.
#ifndef HGEMM_SERVER_TRANSPORT_REFLECTION_SERVICE_H_
#define HGEMM_SERVER_TRANSPORT_REFLECTION_SERVICE_H_

#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"

namespace hgemm {

class ReflectionService final
    : public grpc::reflection::v1alpha::ServerReflection::CallbackService {
 public:
  // `services`: the full names that list_services answers with.
  explicit ReflectionService(std::vector<std::string> services) : services_(std::move(services)) {}

  grpc::ServerBidiReactor<grpc::reflection::v1alpha::ServerReflectionRequest,
                          grpc::reflection::v1alpha::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

  // The answer to one request (public for tests).
  grpc::reflection::v1alpha::ServerReflectionResponse Answer(
      const grpc::reflection::v1alpha::ServerReflectionRequest& request) const;

 private:
  const std::vector<std::string> services_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_REFLECTION_SERVICE_H_
