#include "server/backend/backend.h"

#include <chrono>
#include <cstring>

namespace hgemm {
namespace {

// Host memory one thread reuses from batch to batch: fresh memory would cost a page fault per
// 4 KiB, more than a small batch's GEMM. Past kKeptBytes it is given back after each use.
class ThreadStaging {
 public:
  static constexpr size_t kKeptBytes = size_t{64} << 20;
  ThreadStaging(std::vector<char>* buffer, size_t bytes) : buffer_(buffer) {
    if (buffer_->size() < bytes) buffer_->resize(bytes);
  }
  ~ThreadStaging() {
    if (buffer_->capacity() > kKeptBytes) std::vector<char>().swap(*buffer_);
  }
  ThreadStaging(const ThreadStaging&) = delete;
  ThreadStaging& operator=(const ThreadStaging&) = delete;
  char* data() const { return buffer_->data(); }

 private:
  std::vector<char>* const buffer_;
};

// The first `bytes` of an operand in host memory: `host` itself, or `resident`'s bytes read
// into *copy.
absl::Status HostBytes(Backend& backend, const ResidentBuffer* resident, const void* host,
                       int64_t bytes, std::vector<char>* copy, const char** out) {
  if (resident == nullptr) {
    *out = static_cast<const char*>(host);
    return absl::OkStatus();
  }
  copy->resize(size_t(bytes));
  *out = copy->data();
  return backend.ReadResidentRange(*resident, 0, bytes, copy->data());
}

}  // namespace

GemmJob StackedJob(const std::vector<const GemmJob*>& members) {
  const GemmJob& first = *members.front();
  GemmJob stacked;
  stacked.shape = first.shape;
  stacked.shape.m = 0;
  for (const GemmJob* member : members) stacked.shape.m += member->shape.m;
  stacked.kernel = first.kernel;
  stacked.accumulation = first.accumulation;
  stacked.request_id = first.request_id;
  stacked.owner = first.owner;
  stacked.traceparent = first.traceparent;
  stacked.transpose_a = first.transpose_a;
  stacked.transpose_b = first.transpose_b;
  stacked.b = first.b;
  stacked.b_resident = first.b_resident;
  stacked.pinned.b = first.pinned.b;
  stacked.alpha = first.alpha;
  stacked.beta = first.beta;
  stacked.device_index = first.device_index;
  stacked.stay_on_device = first.stay_on_device;
  stacked.verify = first.verify;
  stacked.verify_repetitions = first.verify_repetitions;
  return stacked;
}

std::vector<absl::Status> Backend::RunBatch(int slot, const std::vector<const GemmJob*>& members,
                                            std::vector<GemmReport>* reports) {
  const auto gather_start = Clock::now();
  GemmJob stacked = StackedJob(members);
  const GemmShape& shape = stacked.shape;
  const int64_t rows = shape.m, n = shape.n, k = shape.k;
  const int64_t ab = ElementBytes(shape.ab_type), cb = ElementBytes(shape.c_type);
  thread_local std::vector<char> a_buffer, c_in_buffer, c_buffer, copy;
  ThreadStaging a(&a_buffer, size_t(shape.ABytes()));
  ThreadStaging c_in(&c_in_buffer, size_t(shape.CInBytes()));
  ThreadStaging c(&c_buffer, size_t(shape.CBytes()));
  // Holds one member's resident A or C_in at a time.
  ThreadStaging copied(&copy, 0);
  int64_t row = 0;  // the first row of the member at hand
  for (const GemmJob* member : members) {
    const int64_t m = member->shape.m;
    const char* source = nullptr;
    if (absl::Status s = HostBytes(*this, member->a_resident.get(), member->a,
                                   member->shape.ABytes(), &copy, &source);
        !s.ok()) {
      return std::vector<absl::Status>(members.size(), s);
    }
    if (stacked.transpose_a) {  // stored k×m: its rows are columns [row, row + m) of k×rows
      for (int64_t l = 0; l < k; ++l) {
        std::memcpy(a.data() + (l * rows + row) * ab, source + l * m * ab, size_t(m * ab));
      }
    } else {
      std::memcpy(a.data() + row * k * ab, source, size_t(m * k * ab));
    }
    if (shape.c_input) {
      if (absl::Status s = HostBytes(*this, member->c_in_resident.get(), member->c_in,
                                     member->shape.CInBytes(), &copy, &source);
          !s.ok()) {
        return std::vector<absl::Status>(members.size(), s);
      }
      std::memcpy(c_in.data() + row * n * cb, source, size_t(m * n * cb));
    }
    row += m;
  }
  stacked.a = reinterpret_cast<const uint16_t*>(a.data());
  stacked.c_in = shape.c_input ? c_in.data() : nullptr;
  stacked.c = c.data();
  const double gather_ms = MillisecondsSince(gather_start);

  GemmReport launch;
  if (absl::Status s = Run(slot, stacked, &launch); !s.ok()) {
    return std::vector<absl::Status>(members.size(), s);
  }
  launch.host_to_device_ms += gather_ms;
  launch.batch_size = int(members.size());
  launch.batch_rows = rows;
  for (GemmReport& report : *reports) report = launch;
  std::vector<absl::Status> statuses(members.size());
  if (!launch.verify_failure.empty()) return statuses;  // no member's C leaves
  row = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const GemmJob& member = *members[i];
    const auto scatter_start = Clock::now();
    const char* member_c = c.data() + row * n * cb;
    const int64_t bytes = member.shape.CBytes();
    row += member.shape.m;
    GemmReport& report = (*reports)[i];
    if (member.keep_c) {
      statuses[i] = AllocateResident(SlotDevice(slot), bytes, &report.c_resident);
      if (statuses[i].ok()) statuses[i] = WriteResident(*report.c_resident, 0, member_c, bytes);
      if (!statuses[i].ok()) report.c_resident.reset();
    } else if (member.c_device) {
      statuses[i] = WriteResident(*member.c_device, 0, member_c, bytes);
    } else {
      std::memcpy(member.c, member_c, size_t(bytes));
    }
    report.device_to_host_ms += MillisecondsSince(scatter_start);
  }
  return statuses;
}

}  // namespace hgemm
