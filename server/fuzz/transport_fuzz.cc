// libFuzzer target: the transport, through a TCP channel to the server on 127.0.0.1
// (transport_harness.h): what the wire adds to the session layer (protobuf messages, the
// reactors' reads and writes, conversions, the status mapping, a client that cancels
// mid-stream or mid-upload). Each input is one or two calls: unary Gemm, GemmStream
// (headers and chunks, then a half-close or a cancel), UploadMatrix (header and chunks, then a
// half-close or a cancel), CreateUpload and UploadPart (parts in range, overlapping, past the
// end, of the wrong size, for another client's upload), Release/List/Download (whole or
// ranged, released after), GetServerInfo, OpenBulk and its lanes (the right capability or a
// mangled one, hellos cut short, fewer or more bytes than the lane's, closed at any point).
// Dimensions are biased to
// boundaries (fuzz_util.h), handles come from earlier calls of the input, "", or fuzz bytes.
// The depth of the service's logic is service_fuzz's, without gRPC: calls are few here because
// each costs real RPCs.
// A call left unanswered or a server crash is a failure. At the end of an input every matrix
// its clients got is released, so inputs stay independent.
#include <fuzzer/FuzzedDataProvider.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/bulk_wire.h"
#include "server/fuzz/fuzz_requests.h"
#include "server/fuzz/transport_harness.h"

namespace hgemm {
namespace {

using fuzz::Check;
using fuzz::Context;
using fuzz::Handle;
using fuzz::StreamChunk;
using fuzz::StreamHeader;
using fuzz::UnaryRequest;
using fuzz::UploadMessage;

void Unary(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  v1::GemmRequest r;
  UnaryRequest(in, handles, &r);
  r.set_c_transient(in.ConsumeBool());
  grpc::ClientContext context;
  Context(&context, client);
  v1::GemmResponse response;
  grpc::Status s = fuzz::Stub().Gemm(&context, r, &response);
  Check(s, "Gemm");
  if (s.ok() && !r.keep_c_resident() && response.c().size() != fuzz::Bytes(r.m(), r.n())) {
    fuzz::Fail("Gemm: C of the wrong size", "");
  }
  if (s.ok() && r.keep_c_resident()) handles.push_back(response.c_matrix().handle());
}

void Stream(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  grpc::ClientContext context;
  Context(&context, client);
  auto stream = fuzz::Stub().GemmStream(&context);
  // Answers are read while requests are written, as a client must: once the flow-control
  // window is full, a stream written whole before reading stalls until its deadline.
  std::vector<std::string> kept;  // C's kept resident, the reader's until joined
  std::thread reader([&] {
    v1::GemmStreamResponse response;
    while (stream->Read(&response)) {
      if (!response.has_done()) continue;
      if (fuzz::ShowsNegativeNumber(response.done().status_message())) {
        fuzz::Fail("a GemmDone shows a wrapped negative number", response.done().status_message());
      }
      if (response.done().has_c_matrix()) kept.push_back(response.done().c_matrix().handle());
    }
  });
  const int messages = in.ConsumeIntegralInRange<int>(0, 12);
  const int cancel_at = in.ConsumeIntegralInRange<int>(0, 2 * messages + 1);  // past: never
  fuzz::NextOffsets offsets[4] = {};
  for (int i = 0; i < messages; ++i) {
    if (i == cancel_at) context.TryCancel();
    v1::GemmStreamRequest m;
    const uint64_t id = in.ConsumeIntegralInRange<uint64_t>(0, 3);
    if (in.ConsumeIntegralInRange<int>(0, 2) == 0) {
      StreamHeader(in, id, handles, offsets[id], m.mutable_header());
    } else {
      StreamChunk(in, id, offsets[id], m.mutable_chunk());
    }
    if (!stream->Write(m)) break;
  }
  stream->WritesDone();
  reader.join();
  handles.insert(handles.end(), kept.begin(), kept.end());
  Check(stream->Finish(), "GemmStream");
}

void Upload(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  grpc::ClientContext context;
  Context(&context, client);
  v1::MatrixInfo info;
  auto writer = fuzz::Stub().UploadMatrix(&context, &info);
  const int messages = in.ConsumeIntegralInRange<int>(0, 6);
  const int cancel_at = in.ConsumeIntegralInRange<int>(0, 2 * messages + 1);  // past: never
  uint32_t rows = fuzz::Dim(in), cols = fuzz::Dim(in);
  for (int i = 0; i < messages; ++i) {
    if (i == cancel_at) context.TryCancel();
    v1::UploadMatrixRequest m;
    UploadMessage(in, i == 0, rows, cols, &m);
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  Check(s, "UploadMatrix");
  if (s.ok()) handles.push_back(info.handle());
}

// CreateUpload, then parts for it or for another handle of the input.
void Parts(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  uint64_t bytes = 0;
  {
    grpc::ClientContext context;
    Context(&context, client);
    v1::UploadCreateRequest r;
    r.mutable_header()->set_rows(fuzz::Dim(in));
    r.mutable_header()->set_cols(fuzz::Dim(in));
    r.mutable_header()->set_dtype(v1::DataType(in.ConsumeIntegralInRange<int>(0, 4)));
    r.set_transient(in.ConsumeBool());
    v1::MatrixInfo info;
    grpc::Status s = fuzz::Stub().CreateUpload(&context, r, &info);
    Check(s, "CreateUpload");
    if (s.ok()) {
      handles.push_back(info.handle());
      bytes = info.bytes();
    }
  }
  const int parts = in.ConsumeIntegralInRange<int>(0, 4);
  for (int part = 0; part < parts; ++part) {
    grpc::ClientContext context;
    Context(&context, client);
    v1::PartResponse response;
    auto writer = fuzz::Stub().UploadPart(&context, &response);
    v1::PartRequest m;
    v1::PartHeader* h = m.mutable_header();
    h->set_handle(Handle(in, handles));
    const bool in_range =
        bytes > 0 && bytes <= (1u << 16) && in.ConsumeIntegralInRange<int>(0, 3) != 0;
    h->set_offset(in_range ? in.ConsumeIntegralInRange<uint64_t>(0, bytes - 1)
                           : in.ConsumeIntegral<uint64_t>());
    h->set_length(in_range ? in.ConsumeIntegralInRange<uint64_t>(1, bytes - h->offset())
                           : in.ConsumeIntegral<uint64_t>());
    const bool header_first = in.ConsumeIntegralInRange<int>(0, 7) != 0;
    if (header_first && !writer->Write(m)) {
      writer->WritesDone();
      Check(writer->Finish(), "UploadPart");
      continue;
    }
    // The announced bytes in one or two chunks, or a fuzzed amount.
    uint64_t left = h->length() <= (1u << 16) && in.ConsumeBool()
                        ? h->length()
                        : in.ConsumeIntegralInRange<uint64_t>(0, 4096);
    while (left > 0) {
      const uint64_t size = in.ConsumeBool() ? left : std::max<uint64_t>(1, left / 2);
      m.set_chunk(std::string(size, '\0'));
      if (!writer->Write(m)) break;
      left -= size;
    }
    writer->WritesDone();
    Check(writer->Finish(), "UploadPart");
  }
}

void Others(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  grpc::ClientContext context;
  Context(&context, client);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: {
      v1::ReleaseMatrixRequest r;
      r.set_handle(Handle(in, handles));
      v1::ReleaseMatrixResponse response;
      Check(fuzz::Stub().ReleaseMatrix(&context, r, &response), "ReleaseMatrix");
      break;
    }
    case 1: {
      v1::ListMatricesResponse response;
      Check(fuzz::Stub().ListMatrices(&context, {}, &response), "ListMatrices");
      break;
    }
    case 2: {
      v1::DownloadMatrixRequest r;
      r.set_handle(Handle(in, handles));
      if (in.ConsumeBool()) {
        r.set_offset(in.ConsumeIntegralInRange<int>(0, 3) == 0
                         ? in.ConsumeIntegral<uint64_t>()
                         : in.ConsumeIntegralInRange<uint64_t>(0, 4096));
        r.set_length(in.ConsumeIntegralInRange<int>(0, 3) == 0
                         ? in.ConsumeIntegral<uint64_t>()
                         : in.ConsumeIntegralInRange<uint64_t>(0, 4096));
        r.set_release_after(in.ConsumeBool());
      }
      auto reader = fuzz::Stub().DownloadMatrix(&context, r);
      v1::ResultChunk chunk;
      while (reader->Read(&chunk)) {
      }
      Check(reader->Finish(), "DownloadMatrix");
      break;
    }
    default: {
      v1::ServerInfo info;
      Check(fuzz::Stub().GetServerInfo(&context, {}, &info), "GetServerInfo");
    }
  }
}

// One bulk lane as a hostile client speaks it; the server must answer or close within the
// call deadline.
void BulkLane(FuzzedDataProvider& in, std::string capability, v1::BulkDirection direction,
              uint64_t length) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(uint16_t(fuzz::Server().bulk_port()));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval deadline{std::chrono::seconds(fuzz::kCallDeadline).count(), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &deadline, sizeof deadline);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &deadline, sizeof deadline);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    fuzz::Fail("bulk: cannot connect", std::strerror(errno));
  }
  bulk::Connection c(fd);
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0 && !capability.empty()) {
    capability[in.ConsumeIntegralInRange<size_t>(0, capability.size() - 1)] ^= 1;
  }
  std::string hello = bulk::Hello(capability);
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) hello[0] = 'X';
  hello.resize(in.ConsumeIntegralInRange<int>(0, 7) == 0
                   ? in.ConsumeIntegralInRange<size_t>(0, hello.size())
                   : hello.size());
  // A receive that timed out: the server neither answered nor closed the lane.
  auto stalled = [](bool received) {
    if (!received && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      fuzz::Fail("bulk: a lane neither answered nor closed within the call deadline", "");
    }
    return received;
  };
  bulk::Frame frame;
  const bool sent = c.SendAll(hello.data(), hello.size());
  if (hello.size() < bulk::kHelloBytes) c.ShutdownSend();
  const bool answered = sent && stalled(c.ReceiveFrame(&frame));
  if (answered && frame.code == 0 && direction == v1::BULK_PUT) {
    // Fewer bytes than the lane's, as many, or more.
    const uint64_t size = std::min<uint64_t>(
        in.ConsumeBool() ? length : in.ConsumeIntegralInRange<uint64_t>(0, length + 64),
        uint64_t(fuzz::kStreamChunkBytes) * 4);
    const std::string bytes(size, '\1');
    (void)c.SendAll(bytes.data(), bytes.size());
    c.ShutdownSend();
    stalled(c.ReceiveFrame(&frame));
  } else if (answered && frame.code == 0) {
    std::string sink(std::min<uint64_t>(length, 1 << 16), '\0');
    for (uint64_t left = length; left > 0;) {
      const size_t want = std::min<uint64_t>(left, sink.size());
      const size_t got = c.ReceiveAll(sink.data(), want);
      if (!stalled(got == want)) break;
      left -= got;
    }
  }
  if (fuzz::ShowsNegativeNumber(frame.message)) {
    fuzz::Fail("bulk: a frame shows a wrapped negative number", frame.message);
  }
}

// OpenBulk for a handle of the input, then some of its lanes (or a made-up capability).
void Bulk(FuzzedDataProvider& in, const std::string& client, std::vector<std::string>& handles) {
  v1::BulkRequest r;
  r.set_handle(Handle(in, handles));
  r.set_direction(v1::BulkDirection(in.ConsumeIntegralInRange<int>(0, 3)));
  const bool small = in.ConsumeIntegralInRange<int>(0, 3) != 0;
  r.set_offset(small ? in.ConsumeIntegralInRange<uint64_t>(0, 4096)
                     : in.ConsumeIntegral<uint64_t>());
  r.set_length(small ? in.ConsumeIntegralInRange<uint64_t>(0, 1 << 16)
                     : in.ConsumeIntegral<uint64_t>());
  r.set_lanes(in.ConsumeIntegralInRange<uint32_t>(0, 5));
  v1::BulkGrant grant;
  {
    grpc::ClientContext context;
    Context(&context, client);
    Check(fuzz::Stub().OpenBulk(&context, r, &grant), "OpenBulk");
  }
  if (grant.lanes().empty()) {
    BulkLane(in, in.ConsumeBytesAsString(bulk::kCapabilityBytes), r.direction(), 0);
    return;
  }
  const int lanes = in.ConsumeIntegralInRange<int>(1, std::min(grant.lanes_size(), 3));
  for (int i = 0; i < lanes; ++i) {
    BulkLane(in, grant.lanes(i).capability(), r.direction(), grant.lanes(i).length());
  }
}

void ReleaseAll(const std::string& client) {
  grpc::ClientContext context;
  Context(&context, client);
  v1::ListMatricesResponse list;
  Check(fuzz::Stub().ListMatrices(&context, {}, &list), "ListMatrices");
  for (const v1::MatrixInfo& m : list.matrices()) {
    grpc::ClientContext c;
    Context(&c, client);
    v1::ReleaseMatrixRequest r;
    r.set_handle(m.handle());
    v1::ReleaseMatrixResponse response;
    Check(fuzz::Stub().ReleaseMatrix(&c, r, &response), "ReleaseMatrix");
  }
}

}  // namespace
}  // namespace hgemm

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hgemm;
  FuzzedDataProvider in(data, size);
  std::vector<std::string> handles;
  bool used[2] = {false, false};  // by fuzz-a, fuzz-b
  for (int call = 0; call < 2 && in.remaining_bytes() > 0; ++call) {
    const bool a = in.ConsumeBool();
    used[a ? 0 : 1] = true;
    const std::string client = a ? "fuzz-a" : "fuzz-b";
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
        Unary(in, client, handles);
        break;
      case 1:
        Stream(in, client, handles);
        break;
      case 2:
        Upload(in, client, handles);
        break;
      case 3:
        Parts(in, client, handles);
        break;
      case 4:
        Bulk(in, client, handles);
        break;
      default:
        Others(in, client, handles);
    }
  }
  // Only a client the input used can hold its matrices: one ListMatrices call fewer when the
  // input used one.
  if (!handles.empty()) {
    if (used[0]) ReleaseAll("fuzz-a");
    if (used[1]) ReleaseAll("fuzz-b");
  }
  return 0;
}
