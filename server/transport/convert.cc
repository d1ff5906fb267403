#include "server/transport/convert.h"

#include <chrono>

#include "server/core/logging.h"

namespace hgemm {

Clock::time_point SteadyDeadline(const grpc::ServerContextBase& context) {
  auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  return Clock::now() + (deadline - std::chrono::system_clock::now());
}

bool OverUnixSocket(const grpc::ServerContextBase& context) {
  // "fd:N": a connection the server accepted on its own Unix socket (server/auth/unix_peers.h);
  // gRPC itself listens on none.
  return context.peer().rfind("fd:", 0) == 0;
}

std::string_view CallTraceparent(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("traceparent");
  if (it == metadata.end()) return {};
  return logging::ValidTraceparent(std::string_view(it->second.data(), it->second.size()));
}

WireEnum<ElementType> FromProto(v1::DataType type) {
  switch (type) {
    case v1::DATA_TYPE_UNSPECIFIED:
      return WireEnum<ElementType>::Unset();
    case v1::DATA_TYPE_FP16:
      return WireEnum<ElementType>::Of(type, ElementType::kFp16);
    case v1::DATA_TYPE_BF16:
      return WireEnum<ElementType>::Of(type, ElementType::kBf16);
    case v1::DATA_TYPE_FP32:
      return WireEnum<ElementType>::Of(type, ElementType::kFp32);
    default:
      return WireEnum<ElementType>::Unknown(type);
  }
}

WireEnum<Accumulation> FromProto(v1::Accumulation accumulation) {
  switch (accumulation) {
    case v1::ACCUMULATION_UNSPECIFIED:
      return WireEnum<Accumulation>::Unset();
    case v1::ACCUMULATION_FP16:
      return WireEnum<Accumulation>::Of(accumulation, Accumulation::kFp16);
    case v1::ACCUMULATION_FP32:
      return WireEnum<Accumulation>::Of(accumulation, Accumulation::kFp32);
    default:
      return WireEnum<Accumulation>::Unknown(accumulation);
  }
}

namespace {

GemmSpec::Options ToSpec(const v1::GemmOptions& options) {
  return {.kernel = options.kernel(),
          .accumulation = FromProto(options.accumulation()),
          .request_id = options.request_id(),
          .verify = options.verify(),
          .verify_repetitions = options.verify_repetitions()};
}

OperandSource ToSource(const v1::RegionRef& region) {
  return OperandSource::Region(region.region(), region.offset());
}

}  // namespace

GemmSpec ToSpec(const v1::GemmRequest& request) {
  GemmSpec spec{.m = request.m(),
                .n = request.n(),
                .k = request.k(),
                .options = ToSpec(request.options()),
                .transpose_a = request.transpose_a(),
                .transpose_b = request.transpose_b(),
                .dtype = FromProto(request.dtype()),
                .c_dtype = FromProto(request.c_dtype()),
                .beta = request.beta(),
                .batch = request.batch(),
                .keep_c_resident = request.keep_c_resident(),
                .c_ttl_seconds = request.c_ttl_seconds(),
                .c_transient = request.c_transient()};
  if (request.has_alpha()) spec.alpha = request.alpha();
  for (const v1::GroupedProblem& p : request.group()) spec.group.push_back({p.m(), p.n(), p.k()});
  switch (request.a_source_case()) {
    case v1::GemmRequest::kAHandle:
      spec.a = OperandSource::Resident(request.a_handle());
      break;
    case v1::GemmRequest::kARegion:
      spec.a = ToSource(request.a_region());
      break;
    default:  // unset: no bytes
      spec.a = OperandSource::Inline(request.a());
  }
  switch (request.b_source_case()) {
    case v1::GemmRequest::kBHandle:
      spec.b = OperandSource::Resident(request.b_handle());
      break;
    case v1::GemmRequest::kBRegion:
      spec.b = ToSource(request.b_region());
      break;
    default:
      spec.b = OperandSource::Inline(request.b());
  }
  switch (request.c_in_source_case()) {
    case v1::GemmRequest::kCIn:
      spec.c_in = OperandSource::Inline(request.c_in());
      break;
    case v1::GemmRequest::kCInHandle:
      spec.c_in = OperandSource::Resident(request.c_in_handle());
      break;
    case v1::GemmRequest::kCInRegion:
      spec.c_in = ToSource(request.c_in_region());
      break;
    case v1::GemmRequest::C_IN_SOURCE_NOT_SET:
      break;
  }
  if (request.has_c_region()) {
    spec.c = ResultSink::Region(request.c_region().region(), request.c_region().offset());
  }
  return spec;
}

GemmSpec ToSpec(const v1::GemmHeader& header) {
  auto source = [](const std::string& handle) {
    return handle.empty() ? OperandSource::Arriving() : OperandSource::Resident(handle);
  };
  GemmSpec spec{.field_prefix = "header.",
                .m = header.m(),
                .n = header.n(),
                .k = header.k(),
                .options = ToSpec(header.options()),
                .transpose_a = header.transpose_a(),
                .transpose_b = header.transpose_b(),
                .dtype = FromProto(header.dtype()),
                .c_dtype = FromProto(header.c_dtype()),
                .beta = header.beta(),
                .batch = header.batch(),
                .a = source(header.a_handle()),
                .b = source(header.b_handle()),
                .c_in = source(header.c_in_handle()),
                .keep_c_resident = header.keep_c_resident(),
                .c_ttl_seconds = header.c_ttl_seconds()};
  if (header.has_alpha()) spec.alpha = header.alpha();
  return spec;
}

StreamMessage ToStreamMessage(v1::GemmStreamRequest& message) {
  switch (message.message_case()) {
    case v1::GemmStreamRequest::kHeader:
      return {StreamMessage::Header{message.header().gemm_id(), ToSpec(message.header())}};
    case v1::GemmStreamRequest::kChunk: {
      v1::MatrixChunk& chunk = *message.mutable_chunk();
      const ChunkOperand operand = chunk.operand() == v1::OPERAND_A   ? ChunkOperand::kA
                                   : chunk.operand() == v1::OPERAND_B ? ChunkOperand::kB
                                   : chunk.operand() == v1::OPERAND_C ? ChunkOperand::kCIn
                                                                      : ChunkOperand::kUnknown;
      return {StreamMessage::Chunk{chunk.gemm_id(), operand, chunk.offset(),
                                   std::move(*chunk.mutable_data())}};
    }
    default:
      return {};
  }
}

MatrixSpec ToSpec(const v1::MatrixHeader& header) {
  MatrixSpec spec{.rows = header.rows(),
                  .cols = header.cols(),
                  .dtype = FromProto(header.dtype()),
                  .ttl_seconds = header.ttl_seconds(),
                  .label = header.label()};
  if (header.has_device_id()) spec.device_id = header.device_id();
  if (header.has_region()) spec.source = ToSource(header.region());
  return spec;
}

RegionSpec ToSpec(const v1::RegisterRegionRequest& request) {
  RegionSpec spec{
      .path = request.path(), .byte_size = request.byte_size(), .label = request.label()};
  if (request.has_cuda_ipc()) {
    spec.cuda_ipc = RegionSpec::CudaIpc{request.cuda_ipc().handle(), request.cuda_ipc().device()};
  }
  return spec;
}

UploadMessage ToUploadMessage(v1::UploadMatrixRequest& message) {
  switch (message.message_case()) {
    case v1::UploadMatrixRequest::kHeader:
      return {ToSpec(message.header())};
    case v1::UploadMatrixRequest::kChunk:
      return {WireBytes(std::move(*message.mutable_chunk()))};
    default:
      return {};
  }
}

PartMessage ToPartMessage(v1::PartRequest& message) {
  switch (message.message_case()) {
    case v1::PartRequest::kHeader: {
      const v1::PartHeader& header = message.header();
      return {PartSpec{header.handle(), header.offset(), header.length()}};
    }
    case v1::PartRequest::kChunk:
      return {WireBytes(std::move(*message.mutable_chunk()))};
    default:
      return {};
  }
}

v1::Accumulation ToProto(Accumulation accumulation) {
  return accumulation == Accumulation::kFp16 ? v1::ACCUMULATION_FP16 : v1::ACCUMULATION_FP32;
}

void ToProto(const DeviceDescription& description, v1::Device* device) {
  device->set_id(description.id);
  device->set_name(description.name);
  device->set_memory_bytes(description.memory_bytes);
  device->set_streams(description.slots);
  device->set_compute_capability(description.compute_capability);
}

v1::DataType ToProto(ElementType type) {
  switch (type) {
    case ElementType::kFp16:
      return v1::DATA_TYPE_FP16;
    case ElementType::kBf16:
      return v1::DATA_TYPE_BF16;
    case ElementType::kFp32:
      return v1::DATA_TYPE_FP32;
  }
  return v1::DATA_TYPE_UNSPECIFIED;
}

void DescribeForms(unsigned layouts, unsigned types, unsigned scaled_types, v1::KernelInfo* info) {
  for (int i = 0; i < 4; ++i) {
    if (layouts & (1u << i)) info->add_layouts(kLayoutNames[i]);
  }
  for (ElementType ab : {ElementType::kFp16, ElementType::kBf16}) {
    for (ElementType c : {ab, ElementType::kFp32}) {
      const unsigned bit = TypesBit(ab, c);
      if ((types & bit) == 0) continue;
      for (v1::KernelTypes* pair :
           {info->add_types(), (scaled_types & bit) ? info->add_scaled_types() : nullptr}) {
        if (pair == nullptr) continue;
        pair->set_dtype(ToProto(ab));
        pair->set_c_dtype(ToProto(c));
      }
    }
  }
}

void ToProto(const GemmShape& shape, const GemmResult& result, v1::Timing* timing,
             v1::Execution* execution) {
  const GemmReport& report = result.report;
  timing->set_queue_wait_ms(report.queue_wait_ms);
  timing->set_host_to_device_ms(report.host_to_device_ms);
  timing->set_kernel_ms(report.kernel_ms);
  timing->set_device_to_host_ms(report.device_to_host_ms);
  timing->set_server_total_ms(report.server_total_ms);
  timing->set_tflops(report.Tflops(shape));
  timing->set_verify_ms(report.verify_ms);
  execution->set_kernel(report.kernel);
  execution->set_accumulation(ToProto(report.accumulation));
  execution->set_device_id(report.device_id);
  execution->set_device_name(report.device_name);
  execution->set_stream_id(report.stream_id);
  execution->set_verified_repetitions(uint32_t(report.verified_repetitions));
  if (report.suspect_device_id) execution->set_suspect_device_id(*report.suspect_device_id);
  execution->set_batch_size(uint32_t(report.batch_size));
  execution->set_batch_rows(uint64_t(report.batch_rows));
  execution->set_backend(result.backend);
}

void ToProto(const RegionInfo& region, v1::RegionInfo* info) {
  const auto now = Clock::now();
  info->set_region(region.handle);
  info->set_byte_size(region.bytes);
  info->set_label(region.label);
  info->set_age_seconds(std::chrono::duration<double>(now - region.created).count());
  info->set_idle_seconds(std::chrono::duration<double>(now - region.last_used).count());
  info->set_ttl_seconds(region.ttl.count());
  info->set_in_use(uint32_t(region.leases));
  info->set_dma(region.dma);
  info->set_cuda_ipc(region.cuda_ipc);
  if (region.cuda_ipc) info->set_device_id(uint32_t(region.device_id));
}

void ToProto(const ResidentMatrix& m, int device_id, const std::string& replica,
             v1::MatrixInfo* info) {
  const auto now = Clock::now();
  info->set_handle(m.handle);
  info->set_rows(m.rows);
  info->set_cols(m.cols);
  info->set_bytes(m.buffer->bytes);
  info->set_device_id(device_id);
  info->set_age_seconds(std::chrono::duration<double>(now - m.created).count());
  info->set_idle_seconds(std::chrono::duration<double>(now - m.last_used).count());
  info->set_ttl_seconds(m.ttl.count());
  info->set_label(m.label);
  info->set_replica(replica);
  info->set_dtype(ToProto(m.dtype));
  info->set_missing_bytes(m.missing_bytes);
  info->set_transient(m.transient);
}

}  // namespace hgemm
