// Conversions between the wire (protobuf messages, a call's context) and the core vocabulary
// (server/core, server/session/gemm_spec.h): the transport's edge, in one place. Nothing below
// the transport sees a protobuf message. Validation of requests is separate
// (server/session/validation.h): a GemmSpec is what the client sent, unchecked.
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
#include "server/session/gemm_spec.h"
#include "server/session/part_session.h"
#include "server/session/stream_assembler.h"
#include "server/session/upload_session.h"

namespace hgemm {

// The call's deadline on the steady clock the scheduler uses (max: none).
Clock::time_point SteadyDeadline(const grpc::ServerContextBase& context);

// True when the call came over a Unix-domain socket (its peer is "unix:...", or "fd:N" on the
// server's own listener): same host.
bool OverUnixSocket(const grpc::ServerContextBase& context);

// The call's W3C trace context ("traceparent" metadata), or "" when absent or malformed.
std::string_view CallTraceparent(const grpc::ServerContextBase& context);

// A wire enum as the core reads it: its number, and its meaning (none for UNSPECIFIED and for
// a number outside the enum, which validation refuses by number).
WireEnum<ElementType> FromProto(v1::DataType type);
WireEnum<Accumulation> FromProto(v1::Accumulation accumulation);

// What a unary request describes. Its inline operands are viewed in place: `request` must
// outlive the spec and the GEMM made of it.
GemmSpec ToSpec(const v1::GemmRequest& request);

// What a stream's header describes (fields named "header.*" in refusals). An operand without a
// handle arrives in chunks.
GemmSpec ToSpec(const v1::GemmHeader& header);

// A GemmStream message as its session reads it. A chunk's bytes are moved out of `message`.
StreamMessage ToStreamMessage(v1::GemmStreamRequest& message);

// A resident matrix's header (UploadMatrix, CreateUpload).
MatrixSpec ToSpec(const v1::MatrixHeader& header);

// A region to register, as its request describes it.
RegionSpec ToSpec(const v1::RegisterRegionRequest& request);

// An UploadMatrix message as its session reads it. A chunk's bytes are moved out of `message`.
UploadMessage ToUploadMessage(v1::UploadMatrixRequest& message);

// An UploadPart message (parsed: not a lone chunk, see lone_chunk.h) as its session reads it.
// A chunk's bytes are moved out of `message`.
PartMessage ToPartMessage(v1::PartRequest& message);

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
