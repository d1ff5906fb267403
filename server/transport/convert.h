// Conversions between the wire (protobuf messages, a call's context) and the core vocabulary
// (server/core): the transport's edge, in one place. Validation of requests is separate
// (server/session/validation.h).
// Thread safety: pure functions; a context must be alive while it is read.
#ifndef HGEMM_SERVER_TRANSPORT_CONVERT_H_
#define HGEMM_SERVER_TRANSPORT_CONVERT_H_

#include <grpcpp/server_context.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "proto/hgemm.pb.h"
#include "server/core/job.h"
#include "server/resident/matrix_store.h"
#include "server/session/gemm_core.h"

namespace hgemm {

// The call's deadline on the steady clock the scheduler uses (max: none).
Clock::time_point SteadyDeadline(const grpc::ServerContextBase& context);

// True when the call came over a Unix-domain socket (its peer is "unix:...", or "fd:N" on the
// server's own listener): same host.
bool OverUnixSocket(const grpc::ServerContextBase& context);

// The call's W3C trace context ("traceparent" metadata), or "" when absent or malformed.
std::string_view CallTraceparent(const grpc::ServerContextBase& context);

// An operand's bytes as the fp16 elements a GemmJob points to.
inline const uint16_t* HalfData(const std::string& bytes) {
  return reinterpret_cast<const uint16_t*>(bytes.data());
}

// Where `request`'s operands come from and where its C goes (order->a, b, c_in, c and
// over_unix_socket; order->job untouched).
void ToOrder(const v1::GemmRequest& request, bool over_unix_socket, GemmOrder* order);

v1::Accumulation ToProto(Accumulation accumulation);
v1::DataType ToProto(ElementType type);

// Adds the layouts, type pairs and type pairs with alpha/beta of bit sets (server/core/shape.h)
// to a kernel's description.
void DescribeForms(unsigned layouts, unsigned types, unsigned scaled_types, v1::KernelInfo* info);

// Fills the proto's timing and execution from what a GEMM of `shape` came to.
void ToProto(const GemmShape& shape, const GemmResult& result, v1::Timing* timing,
             v1::Execution* execution);

// Describes a backend device.
void ToProto(const DeviceDescription& description, v1::Device* device);

// Describes a shared-memory region.
void ToProto(const RegionInfo& region, v1::RegionInfo* info);

// Describes a resident matrix living on the device with id `device_id` of replica `replica`.
void ToProto(const ResidentMatrix& matrix, int device_id, const std::string& replica,
             v1::MatrixInfo* info);

}  // namespace hgemm

#endif  // HGEMM_SERVER_TRANSPORT_CONVERT_H_
