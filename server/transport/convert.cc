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

void ToOrder(const v1::GemmRequest& request, bool over_unix_socket, GemmOrder* order) {
  order->a = request.has_a_region()
                 ? OperandSource::Region(request.a_region().region(), request.a_region().offset())
             : request.a_handle().empty() ? OperandSource::Inline(HalfData(request.a()))
                                          : OperandSource::Resident(request.a_handle());
  order->b = request.has_b_region()
                 ? OperandSource::Region(request.b_region().region(), request.b_region().offset())
             : request.b_handle().empty() ? OperandSource::Inline(HalfData(request.b()))
                                          : OperandSource::Resident(request.b_handle());
  switch (request.c_in_source_case()) {
    case v1::GemmRequest::kCIn:
      order->c_in = OperandSource::Inline(HalfData(request.c_in()));
      break;
    case v1::GemmRequest::kCInHandle:
      order->c_in = OperandSource::Resident(request.c_in_handle());
      break;
    case v1::GemmRequest::kCInRegion:
      order->c_in = OperandSource::Region(request.c_in_region().region(),
                                          request.c_in_region().offset());
      break;
    case v1::GemmRequest::C_IN_SOURCE_NOT_SET:
      break;
  }
  order->c = request.has_c_region()
                 ? ResultSink::Region(request.c_region().region(), request.c_region().offset())
             : request.keep_c_resident()
                 ? ResultSink::KeepResident(request.c_ttl_seconds(), request.c_transient())
                 : ResultSink::Host();
  order->over_unix_socket = over_unix_socket;
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
