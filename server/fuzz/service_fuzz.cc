// libFuzzer target: the whole service below its transport (session_harness.h). Each input is a
// sequence of up to 8 calls of two clients, made through the session layer as the gRPC
// handlers make them: unary Gemm (some with a passed deadline or a cancelled client; some
// sent at once, each its own rows against one B handle, as the scheduler batches them),
// GemmStream (headers and chunks, C_in's too; the client half-closes or cancels; the idle
// timeout or a drain may strike), UploadMatrix (header and chunks, or a header naming a
// region; closes, cancels, idles out), Release/List/Download, and shared-memory regions
// (register a memfd of this process, sealed or not, of a size the file has or not; unregister;
// list; the client shrinks its file). Requests carry the BLAS fields: transposes, fp16/bf16
// operands, C of their type or fp32, α and β with a C_in (inline, a handle, a region), a batch
// or a group; A, B, C_in and C may lie in regions, at offsets at and past their ends.
// Dimensions are biased to boundaries (fuzz_util.h), handles come from earlier calls of the
// input, "", or fuzz bytes.
// Oracle: no crash (ASan: no access outside a mapping, no SIGBUS from a shrunk file), every
// call ends (no hang), the transport contract and C's size hold (session_harness.h), no status
// shows a wrapped number, a download has the matrix's size, and once every matrix and region
// of the input is released its clients hold no resident or region bytes (nothing leaked a
// quota reservation or a lease). Every operand of an input is ±0 and C_in with β = 0 is NaN,
// so an answered C — to the host (poisoned with NaN first), into a region (poisoned where it
// reads no operand) or kept and downloaded — must hold only ±0: a C not written, written
// from the wrong place or mixing in C_in with β = 0 shows. A region that can shrink is never
// registered. Inputs stay independent.
// The wire itself (protobuf, reactors, status mapping) is transport_fuzz's.
#include <fmt/format.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "server/fuzz/fuzz_requests.h"
#include "server/fuzz/session_harness.h"
#include "server/testing/core_regions.h"
#include "server/testing/memfd.h"

namespace hgemm {
namespace {

using fuzz::Handle;
using fuzz::Services;
using fuzz::StreamChunk;
using fuzz::StreamHeader;
using fuzz::UnaryRequest;
using fuzz::UploadMessage;

// The largest file a region of an input is made of: 2x the largest operand (fuzz_util.h), so
// that offsets put operands inside, at the end of and past a region.
constexpr int64_t kRegionFileBytes = 4 * fuzz::kMaxElementsPerMatrix;
// The largest exact operand an input sends inline (a batch's or a group's too).
constexpr size_t kMaxInlineBytes = 1u << 18;

// A region of one of the input's clients: a memfd of this process, sealed against shrinking
// unless drawn otherwise, and mapped here too, where the harness poisons and reads C. Its
// handle is "" when Register refused it.
struct ClientRegion {
  ClientRegion(int64_t file_bytes, bool sealed) : file(file_bytes, sealed), bytes(file_bytes) {
    if (file.fd() < 0) fuzz::Fail("memfd", "cannot make one");
    void* p = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, file.fd(), 0);
    if (p == MAP_FAILED) fuzz::Fail("mmap", "cannot map the memfd");
    base = static_cast<uint8_t*>(p);
  }
  ~ClientRegion() { munmap(base, size_t(bytes)); }
  ClientRegion(const ClientRegion&) = delete;
  ClientRegion& operator=(const ClientRegion&) = delete;

  TestMemfd file;
  int64_t bytes;  // of the file and of the mapping here
  uint8_t* base = nullptr;
  bool sealed = false;
  std::string handle;
  std::string owner;
};
using Regions = std::vector<std::unique_ptr<ClientRegion>>;

// A region of the input (any client's: another's must read as none), "", or fuzz bytes; and
// the input's region it names, if any.
std::string RegionHandle(FuzzedDataProvider& in, const Regions& regions, ClientRegion** named) {
  *named = nullptr;
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return "";
    case 1:
      return in.ConsumeRandomLengthString(40);
    default:
      if (regions.empty()) return "r-00000000000000000000000000000000";
      *named = regions[in.ConsumeIntegralInRange<size_t>(0, regions.size() - 1)].get();
      return (*named)->handle;
  }
}

// Where in a region `bytes` of an operand start: mostly in range and even, else exactly at the
// end, one element past it, odd, or where 64 bits wrap.
uint64_t RegionOffset(FuzzedDataProvider& in, const ClientRegion* region, uint64_t bytes) {
  const uint64_t size = region == nullptr ? uint64_t(kRegionFileBytes) : uint64_t(region->bytes);
  const uint64_t room = size > bytes ? size - bytes : 0;
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return room;  // ends at the region's end
    case 1:
      return room + 2;  // one element past it
    case 2:
      return 2 * in.ConsumeIntegralInRange<uint64_t>(0, room / 2) + 1;
    case 3:
      return UINT64_MAX - 2 * in.ConsumeIntegralInRange<uint64_t>(0, 8) - 1;
    case 4:
      return in.ConsumeIntegral<uint64_t>();
    case 5:
      return 2 * in.ConsumeIntegralInRange<uint64_t>(0, room / 2);  // element-aligned
    default:
      return kRegionAlignment * in.ConsumeIntegralInRange<uint64_t>(0, room / kRegionAlignment);
  }
}

struct Placed {
  ClientRegion* region = nullptr;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Points `ref` at `bytes` of a region of the input (or not one); what it names.
Placed InRegion(FuzzedDataProvider& in, const Regions& regions, uint64_t bytes,
                v1::RegionRef* ref) {
  Placed p;
  ref->set_region(RegionHandle(in, regions, &p.region));
  p.offset = RegionOffset(in, p.region, bytes);
  p.bytes = bytes;
  ref->set_offset(p.offset);
  return p;
}

bool Overlap(const Placed& a, const Placed& b) {
  return a.region != nullptr && a.region == b.region && a.offset < b.offset + b.bytes &&
         b.offset < a.offset + a.bytes;
}

// Whether [offset, offset + bytes) lies within the region's file.
bool Within(const Placed& p) {
  return p.region != nullptr && p.offset <= uint64_t(p.region->bytes) &&
         p.bytes <= uint64_t(p.region->bytes) - p.offset;
}

// C of zero operands: every element ±0, i.e. every byte 0x00 or 0x80 (a sign byte) in fp16,
// bf16 and fp32 alike.
void CheckZeros(const uint8_t* c, size_t bytes, const char* where) {
  for (size_t i = 0; i < bytes; ++i) {
    if (c[i] != 0x00 && c[i] != 0x80) {
      fuzz::Fail("a C of zero operands is not zero",
                 (std::string(where) + " at byte " + std::to_string(i)).c_str());
    }
  }
}

// Mostly a deadline the call meets; sometimes one already passed.
Clock::time_point Deadline(FuzzedDataProvider& in) {
  return in.ConsumeIntegralInRange<int>(0, 7) == 0 ? Clock::now() - std::chrono::milliseconds(1)
                                                   : Clock::now() + fuzz::kCallDeadline;
}

v1::DataType Type(FuzzedDataProvider& in) {
  return v1::DataType(in.ConsumeIntegralInRange<int>(0, 7) == 0
                          ? in.ConsumeIntegralInRange<int>(3, 5)
                          : in.ConsumeIntegralInRange<int>(0, 2));
}

// α: unset or a finite value mostly, sometimes NaN or ∞ (refused); β: mostly 0, else the like.
float Scale(FuzzedDataProvider& in, bool beta) {
  static constexpr float kScales[] = {1.0f, 2.0f, -0.5f, 0.0f, 1e-3f, 65504.0f, 3e38f, -1.0f};
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return std::numeric_limits<float>::infinity();
    case 2:
    case 3:
    case 4:
    case 5:
    case 6:
    case 7:
    case 8:
      if (beta) return 0.0f;
      [[fallthrough]];
    default:
      return kScales[in.ConsumeIntegralInRange<size_t>(0, std::size(kScales) - 1)];
  }
}

// The form of a GemmRequest or GemmHeader: transposes, types, α, β.
template <typename Message>
void Form(FuzzedDataProvider& in, Message* m) {
  m->set_transpose_a(in.ConsumeBool());
  m->set_transpose_b(in.ConsumeBool());
  m->set_dtype(Type(in));
  m->set_c_dtype(Type(in));
  if (in.ConsumeBool()) m->set_alpha(Scale(in, false));
  m->set_beta(Scale(in, true));
}

int64_t ElementSize(v1::DataType t) { return t == v1::DATA_TYPE_FP32 ? 4 : 2; }

// Byte lengths of a request's operands as its fields make them exact (128-bit: no wrap).
struct ExactBytes {
  unsigned __int128 a = 0, b = 0, c = 0;
};
ExactBytes Exact(const v1::GemmRequest& r) {
  const unsigned __int128 ab = uint64_t(ElementSize(r.dtype()));
  const unsigned __int128 cb =
      uint64_t(ElementSize(r.c_dtype() == v1::DATA_TYPE_UNSPECIFIED ? r.dtype() : r.c_dtype()));
  ExactBytes e;
  if (r.group_size() > 0) {
    for (const v1::GroupedProblem& p : r.group()) {
      e.a += ab * p.m() * p.k();
      e.b += ab * p.k() * p.n();
      e.c += cb * p.m() * p.n();
    }
    return e;
  }
  const unsigned __int128 items = std::max<uint32_t>(r.batch(), 1);
  e.a = items * ab * r.m() * r.k();
  e.b = items * ab * r.k() * r.n();
  e.c = items * cb * r.m() * r.n();
  return e;
}

// The BLAS fields of a unary request (transposes, types, α/β and C_in, a batch or a group) and
// its operands re-drawn to the sizes those make exact; some of A, B, C_in and C in regions.
// Returns where C goes in a region and the regions the request reads.
struct Placement {
  Placed c;
  std::vector<Placed> reads;
  Placed nan_c_in;  // a C_in in a region filled with NaN (β = 0), zeroed after the call
};
Placement BlasRequest(FuzzedDataProvider& in, const std::vector<std::string>& handles,
                      const Regions& regions, v1::GemmRequest* r) {
  Form(in, r);
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      r->set_batch(in.ConsumeIntegralInRange<uint32_t>(0, 4));
      break;
    case 1:
      r->set_batch(fuzz::Dim(in));
      break;
    case 2: {
      r->set_m(in.ConsumeBool() ? 0 : r->m());
      r->set_n(in.ConsumeBool() ? 0 : r->n());
      r->set_k(in.ConsumeBool() ? 0 : r->k());
      const int problems = in.ConsumeIntegralInRange<int>(0, 10);
      for (int i = 0; i < problems; ++i) {
        v1::GroupedProblem* p = r->add_group();
        const bool small = in.ConsumeIntegralInRange<int>(0, 7) != 0;
        p->set_m(small ? in.ConsumeIntegralInRange<uint32_t>(0, 24) : fuzz::Dim(in));
        p->set_n(small ? in.ConsumeIntegralInRange<uint32_t>(0, 24) : fuzz::Dim(in));
        p->set_k(small ? in.ConsumeIntegralInRange<uint32_t>(0, 24) : fuzz::Dim(in));
      }
      break;
    }
    default:
      break;
  }
  const ExactBytes exact = Exact(*r);
  if (r->a_handle().empty()) r->set_a(fuzz::ExactOrShort(in, exact.a, '\0', kMaxInlineBytes));
  if (r->b_handle().empty()) r->set_b(fuzz::ExactOrShort(in, exact.b, '\0', kMaxInlineBytes));
  // C_in: NaN where β = 0 (it must not be read), zeros otherwise.
  const char c_in_fill = r->beta() == 0 ? '\xff' : '\0';
  Placement placement;
  Placed c_in;
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
    case 1:
      r->set_c_in(fuzz::ExactOrShort(in, exact.c, c_in_fill, kMaxInlineBytes));
      break;
    case 2:
      r->set_c_in_handle(Handle(in, handles));
      break;
    case 3:
      c_in = InRegion(in, regions, uint64_t(std::min<unsigned __int128>(exact.c, UINT64_MAX)),
                      r->mutable_c_in_region());
      break;
    default:
      break;
  }
  const auto clamp = [](unsigned __int128 v) {
    return uint64_t(std::min<unsigned __int128>(v, UINT64_MAX));
  };
  Placed a, b;
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    a = InRegion(in, regions, clamp(exact.a), r->mutable_a_region());
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    b = InRegion(in, regions, clamp(exact.b), r->mutable_b_region());
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    placement.c = InRegion(in, regions, clamp(exact.c), r->mutable_c_region());
  }
  placement.reads = {c_in, a, b};
  // A NaN C_in in a region only where neither A nor B shares its bytes: they would read NaN.
  if (r->beta() == 0 && Within(c_in) && !Overlap(a, c_in) && !Overlap(b, c_in)) {
    std::fill_n(c_in.region->base + c_in.offset, c_in.bytes, uint8_t(0xff));
    placement.nan_c_in = c_in;
  }
  return placement;
}

void Unary(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles,
           const Regions& regions) {
  v1::GemmRequest r;
  UnaryRequest(in, handles, &r);
  const bool blas = in.ConsumeIntegralInRange<int>(0, 3) != 0;
  const Placement placement = blas ? BlasRequest(in, handles, regions, &r) : Placement{};
  const Clock::time_point deadline = Deadline(in);
  const bool cancelled = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  const bool over_unix_socket = in.ConsumeIntegralInRange<int>(0, 7) != 0;
  // C into a region: poisoned first where the GEMM reads no operand of its own.
  const Placed& c_region = placement.c;
  const bool poisoned =
      Within(c_region) && std::none_of(placement.reads.begin(), placement.reads.end(),
                                       [&](const Placed& p) { return Overlap(p, c_region); });
  if (poisoned) std::fill_n(c_region.region->base + c_region.offset, c_region.bytes, 0xff);
  std::string c;
  ResidentMatrix kept;
  absl::Status s = fuzz::RunGemm(client, r, deadline, cancelled, over_unix_socket, &c, &kept);
  fuzz::CheckMessage(s);
  if (s.ok() && !c.empty())
    CheckZeros(reinterpret_cast<const uint8_t*>(c.data()), c.size(), "host C");
  // No region the GEMM used may sit off the alignment (C_in is not read when beta is 0).
  for (const auto& [field, ref] : {std::pair{"a_region", &r.a_region()},
                                   {"b_region", &r.b_region()},
                                   {"c_in_region", &r.c_in_region()},
                                   {"c_region", &r.c_region()}}) {
    const bool used = ref != &r.c_in_region() || r.beta() != 0;
    if (s.ok() && used && !ref->region().empty() && ref->offset() % kRegionAlignment != 0) {
      fuzz::Fail("a GEMM ran with a region offset off the alignment",
                 fmt::format("{} at {}", field, ref->offset()));
    }
  }
  if (poisoned) {
    if (s.ok()) {
      CheckZeros(c_region.region->base + c_region.offset, c_region.bytes, "C in a region");
    } else {
      std::fill_n(c_region.region->base + c_region.offset, c_region.bytes, 0);
    }
  }
  const Placed& nan = placement.nan_c_in;
  if (Within(nan)) std::fill_n(nan.region->base + nan.offset, nan.bytes, 0);  // for later calls
  if (s.ok() && r.keep_c_resident() && !r.has_c_region()) handles.push_back(kept.handle);
}

// Unary GEMMs of one client sent at once, each its own rows against one B handle: they may
// share a launch (the scheduler's batching) and must each be answered as alone, C all zeros.
// B's k and n are the matrix's when the handle is one of the client's, so that most pass
// validation; some are cancelled or past their deadline.
void SharedB(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  const std::string b = Handle(in, handles);
  uint32_t k = fuzz::Dim(in), n = fuzz::Dim(in);
  for (const ResidentMatrix& m : Services().store.List(client)) {
    if (m.handle == b) std::tie(k, n) = std::pair{m.rows, m.cols};
  }
  struct Call {
    v1::GemmRequest request;
    Clock::time_point deadline;
    bool cancelled = false;
    absl::Status status;
    std::string c;
    ResidentMatrix kept;
  };
  std::vector<Call> calls(in.ConsumeIntegralInRange<size_t>(2, 4));
  for (Call& call : calls) {
    v1::GemmRequest& r = call.request;
    r.set_m(fuzz::Dim(in));
    r.set_n(n);
    r.set_k(k);
    r.set_a(fuzz::OperandBytes(in, r.m(), k));
    r.set_b_handle(b);
    r.set_keep_c_resident(in.ConsumeIntegralInRange<int>(0, 3) == 0);
    call.deadline = Deadline(in);
    call.cancelled = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  }
  std::vector<std::thread> threads;
  for (Call& call : calls) {
    threads.emplace_back([&client, &call] {
      call.status = fuzz::RunGemm(client, call.request, call.deadline, call.cancelled,
                                  /*over_unix_socket=*/false, &call.c, &call.kept);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (Call& call : calls) {
    fuzz::CheckMessage(call.status);
    if (!call.status.ok()) continue;
    if (!call.c.empty()) {
      CheckZeros(reinterpret_cast<const uint8_t*>(call.c.data()), call.c.size(), "host C");
    }
    if (call.request.keep_c_resident()) handles.push_back(call.kept.handle);
  }
}

// The BLAS fields of a streamed GEMM's header: transposes, types, α/β, a C_in handle, a batch.
void BlasHeader(FuzzedDataProvider& in, const std::vector<std::string>& handles,
                v1::GemmHeader* h) {
  Form(in, h);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) h->set_c_in_handle(Handle(in, handles));
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    h->set_batch(in.ConsumeIntegralInRange<uint32_t>(0, 4));
}

void Stream(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  fuzz::FuzzStream stream(client, Deadline(in));
  const int messages = in.ConsumeIntegralInRange<int>(0, 12);
  fuzz::NextOffsets offsets[4] = {};
  for (int i = 0; i < messages; ++i) {
    v1::GemmStreamRequest m;
    const uint64_t id = in.ConsumeIntegralInRange<uint64_t>(0, 3);
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:  // every GEMM waiting for a chunk has waited too long
        stream.session().ExpireIdle(Clock::now() + std::chrono::hours(1));
        continue;
      case 1:
        stream.session().Drain();
        continue;
      case 2:
      case 3:
      case 4:
      case 5: {
        StreamHeader(in, id, handles, offsets[id], m.mutable_header());
        if (in.ConsumeBool()) BlasHeader(in, handles, m.mutable_header());
        break;
      }
      default: {
        StreamChunk(in, id, offsets[id], m.mutable_chunk(), v1::OPERAND_C);
      }
    }
    if (!stream.Deliver(m)) break;
  }
  stream.Close(/*cancel=*/in.ConsumeIntegralInRange<int>(0, 7) == 0);
  stream.Outcome().IgnoreError();  // checked in Finish
  for (const fuzz::FuzzStream::Done& done : stream.answers()) {
    if (!done.kept_c.empty()) handles.push_back(done.kept_c);
  }
}

void Upload(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles,
            const Regions& regions) {
  fuzz::FuzzUpload upload(client, /*over_unix_socket=*/true);
  const int messages = in.ConsumeIntegralInRange<int>(0, 6);
  uint32_t rows = fuzz::Dim(in), cols = fuzz::Dim(in);
  for (int i = 0; i < messages; ++i) {
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      upload.session().ExpireIdle(Clock::now() + std::chrono::hours(1));
      continue;
    }
    v1::UploadMatrixRequest m;
    UploadMessage(in, i == 0, rows, cols, &m);
    if (m.has_header() && in.ConsumeIntegralInRange<int>(0, 3) == 0) {
      v1::MatrixHeader* h = m.mutable_header();
      h->set_dtype(Type(in));
      InRegion(in, regions,
               uint64_t(std::min<unsigned __int128>(fuzz::Bytes(rows, cols), UINT64_MAX)),
               h->mutable_region());
    }
    if (!upload.Deliver(m)) break;
  }
  upload.Close(/*cancel=*/in.ConsumeIntegralInRange<int>(0, 7) == 0);
  ResidentMatrix matrix;
  if (upload.Outcome(&matrix).ok()) handles.push_back(matrix.handle);
}

// What a same-host client does with its regions: registers a memfd (mostly sealed, of a size
// it has), unregisters one (its own, another's, a stale one, while a GEMM may hold it), lists
// them, or shrinks its file (refused by the seal of every registered one).
void RegionCall(FuzzedDataProvider& in, const std::string& client, Regions& regions) {
  GemmCore& core = Services().core;
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
    case 1: {
      if (regions.size() >= 2 * size_t(fuzz::kRegionsPerClient) + 2) break;
      const bool sealed = in.ConsumeIntegralInRange<int>(0, 7) != 0;
      auto region = std::make_unique<ClientRegion>(
          2 * in.ConsumeIntegralInRange<int64_t>(1, kRegionFileBytes / 2), sealed);
      region->sealed = sealed;
      region->owner = client;
      int64_t asked = region->bytes;
      switch (in.ConsumeIntegralInRange<int>(0, 7)) {
        case 0:
          asked = region->bytes + 1;
          break;
        case 1:
          asked = in.ConsumeIntegralInRange<int64_t>(-1, 0);
          break;
        case 2:
          asked = in.ConsumeIntegral<int64_t>();
          break;
        case 3:
          asked = in.ConsumeIntegralInRange<int64_t>(1, region->bytes);
          break;
        default:
          break;
      }
      const std::string path = in.ConsumeIntegralInRange<int>(0, 15) == 0
                                   ? in.ConsumeRandomLengthString(40)
                                   : region->file.path();
      const std::string label = in.ConsumeIntegralInRange<int>(0, 7) == 0
                                    ? std::string(in.ConsumeIntegralInRange<size_t>(0, 300), 'l')
                                    : "fuzz";
      RegionInfo info;
      // Mostly this process (its own memfds); sometimes a process it is not.
      RegisteringProcess caller = ThisProcess();
      if (in.ConsumeIntegralInRange<int>(0, 15) == 0) caller.pid = getppid();
      const absl::Status s = RegisterMemfdNow(core, client, caller, path, asked, label, &info);
      fuzz::CheckMessage(s);
      if (s.ok()) {
        if (!sealed) fuzz::Fail("a region whose file can shrink was registered", path);
        if (caller.pid != getpid()) fuzz::Fail("another process's file was registered", path);
        if (info.bytes != asked || asked > region->bytes) {
          fuzz::Fail("a region registered with another size", std::to_string(asked));
        }
        region->handle = info.handle;
      }
      regions.push_back(std::move(region));
      break;
    }
    case 2: {
      ClientRegion* named = nullptr;
      int64_t freed = 0;
      fuzz::CheckMessage(core.UnregisterRegion(client, /*over_unix_socket=*/true,
                                               RegionHandle(in, regions, &named), &freed));
      break;
    }
    case 3: {
      RegionList listed;
      fuzz::CheckMessage(core.ListRegions(client, /*over_unix_socket=*/true, &listed));
      break;
    }
    default: {
      if (regions.empty()) break;
      ClientRegion& r = *regions[in.ConsumeIntegralInRange<size_t>(0, regions.size() - 1)];
      if (r.sealed &&
          ftruncate(r.file.fd(), in.ConsumeIntegralInRange<int64_t>(0, r.bytes - 1)) == 0) {
        fuzz::Fail("a sealed region's file shrank", r.handle);
      }
    }
  }
}

void Others(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  MatrixStore& store = Services().store;
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: {
      int64_t freed = 0;
      fuzz::CheckMessage(store.Release(client, Handle(in, handles), &freed, /*admin=*/false));
      break;
    }
    case 1:
      store.List(client);
      store.ClientBytes(client);
      break;
    default: {  // what the DownloadMatrix reactor reads
      ResidentMatrix m;
      absl::Status s = store.Lookup(client, Handle(in, handles), "handle", &m);
      fuzz::CheckMessage(s);
      if (!s.ok()) break;
      std::string data(size_t(m.buffer->bytes), '\0');
      fuzz::CheckMessage(Services().backend->ReadResident(*m.buffer, data.data()));
      if (m.buffer->bytes != MatrixBytes(m.rows, m.cols, m.dtype)) {
        fuzz::Fail("a resident matrix of the wrong size", m.handle);
      }
      CheckZeros(reinterpret_cast<const uint8_t*>(data.data()), data.size(), "a resident matrix");
    }
  }
}

// Releases every matrix of `client`; then its resident bytes must come back to 0 (a GEMM's
// reservation is given back on a scheduler thread, just after its answer).
void ReleaseAll(const std::string& client) {
  MatrixStore& store = Services().store;
  for (const ResidentMatrix& m : store.List(client)) {
    int64_t freed = 0;
    store.Release(client, m.handle, &freed, /*admin=*/false).IgnoreError();  // bytes checked below
  }
  const auto give_up = std::chrono::steady_clock::now() + fuzz::kCallDeadline;
  while (store.ClientBytes(client) != 0) {
    if (std::chrono::steady_clock::now() > give_up) {
      fuzz::Fail("resident bytes left after every matrix was released", client);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Unregisters every region of `client` (a lease is given back just after its GEMM's answer, so
// a refusal is retried); then it must hold no region bytes.
void UnregisterAll(const std::string& client) {
  GemmCore& core = Services().core;
  // Every call here comes over the Unix socket, as a same-host client's would.
  auto list = [&] {
    RegionList listed;
    fuzz::CheckMessage(core.ListRegions(client, /*over_unix_socket=*/true, &listed));
    return listed;
  };
  const auto give_up = std::chrono::steady_clock::now() + fuzz::kCallDeadline;
  for (RegionList left = list(); !left.regions.empty(); left = list()) {
    for (const RegionInfo& r : left.regions) {
      int64_t freed = 0;
      // Retried until none is left.
      core.UnregisterRegion(client, /*over_unix_socket=*/true, r.handle, &freed).IgnoreError();
    }
    if (std::chrono::steady_clock::now() > give_up) {
      fuzz::Fail("a region stays leased after every GEMM was answered", client);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (list().owner_bytes != 0) fuzz::Fail("region bytes left after unregistering", client);
}

}  // namespace
}  // namespace hgemm

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hgemm::fuzz::Services();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hgemm;
  FuzzedDataProvider in(data, size);
  std::vector<std::string> handles;
  Regions regions;  // unmapped after the server let go of them
  for (int call = 0; call < 8 && in.remaining_bytes() > 0; ++call) {
    const std::string client = in.ConsumeBool() ? "fuzz-a" : "fuzz-b";
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
        Unary(in, client, handles, regions);
        break;
      case 1:
        Stream(in, client, handles);
        break;
      case 2:
        Upload(in, client, handles, regions);
        break;
      case 3:
        RegionCall(in, client, regions);
        break;
      case 4:
        SharedB(in, client, handles);
        break;
      default:
        Others(in, client, handles);
    }
  }
  ReleaseAll("fuzz-a");
  ReleaseAll("fuzz-b");
  UnregisterAll("fuzz-a");
  UnregisterAll("fuzz-b");
  return 0;
}
