// libFuzzer target: UploadMatrix message sequences against the in-process server
// (service_harness.h). Each input is a few uploads, each by a client of its own: headers with
// fuzzed fields, chunks of fuzzed sizes and contents, headers again, early half-closes and
// cancellations.
// Besides "answered, no crash", the oracle: an upload that succeeds was exactly one header and
// then exactly rows·cols fp16 values, and downloads back byte for byte; one that fails leaves
// its client no resident bytes (its quota reservation and buffer are given back: before its
// status reaches the client, or soon after a client-side cancellation).
#include <fuzzer/FuzzedDataProvider.h>

#include <chrono>
#include <string>
#include <thread>

#include "server/fuzz/service_harness.h"

namespace hgemm {
namespace {

// Each upload is its own client, so that what the server still does for an earlier one (a
// cancelled upload it has not even read yet) can't show in a later one's accounting.
std::string NewClient() {
  static uint64_t uploads = 0;
  return "upload-fuzz-" + std::to_string(uploads++);
}

int64_t ClientBytes(const std::string& client) {
  grpc::ClientContext context;
  fuzz::Context(&context, client);
  v1::ListMatricesResponse list;
  fuzz::Check(fuzz::Stub().ListMatrices(&context, {}, &list), "ListMatrices");
  return list.client_bytes();
}

void Release(const std::string& client, const std::string& handle) {
  grpc::ClientContext context;
  fuzz::Context(&context, client);
  v1::ReleaseMatrixRequest request;
  request.set_handle(handle);
  v1::ReleaseMatrixResponse response;
  grpc::Status s = fuzz::Stub().ReleaseMatrix(&context, request, &response);
  if (!s.ok()) fuzz::Fail("ReleaseMatrix of a fresh upload", s.error_message());
}

std::string Download(const std::string& client, const std::string& handle) {
  grpc::ClientContext context;
  fuzz::Context(&context, client);
  v1::DownloadMatrixRequest request;
  request.set_handle(handle);
  auto reader = fuzz::Stub().DownloadMatrix(&context, request);
  std::string data;
  for (v1::ResultChunk chunk; reader->Read(&chunk);) {
    if (chunk.offset() != data.size()) fuzz::Fail("DownloadMatrix chunk out of order", "");
    data += chunk.data();
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) fuzz::Fail("DownloadMatrix of a fresh upload", s.error_message());
  return data;
}

void Upload(FuzzedDataProvider& in) {
  const std::string client = NewClient();
  grpc::ClientContext context;
  fuzz::Context(&context, client);
  v1::MatrixInfo info;
  auto writer = fuzz::Stub().UploadMatrix(&context, &info);
  const uint32_t rows = fuzz::Dim(in), cols = fuzz::Dim(in);
  const unsigned __int128 exact = fuzz::Bytes(rows, cols);
  int headers = 0;
  bool header_first = false, cancelled = false;
  std::string sent;  // chunk bytes, in order
  const int messages = in.ConsumeIntegralInRange<int>(0, 10);
  for (int i = 0; i < messages && !cancelled; ++i) {
    v1::UploadMatrixRequest m;
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0:
      case 1: {
        v1::MatrixHeader* h = m.mutable_header();
        h->set_rows(rows);
        h->set_cols(cols);
        if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
          h->set_device_id(in.ConsumeIntegralInRange<int>(-2, 1));
        }
        h->set_ttl_seconds(in.ConsumeIntegralInRange<uint32_t>(0, 3600));
        if (in.ConsumeBool()) {
          h->set_label(std::string(in.ConsumeIntegralInRange<size_t>(0, 200), 'l'));
        }
        header_first = header_first || (i == 0);
        headers++;
        break;
      }
      case 2:
        context.TryCancel();
        cancelled = true;
        continue;
      default: {
        // Mostly what is left of the matrix, in one or a few pieces; sometimes any size.
        const size_t left =
            exact > sent.size() ? size_t(std::min<unsigned __int128>(exact - sent.size(), 1 << 16))
                                : 0;
        size_t size = in.ConsumeBool() && left > 0
                          ? in.ConsumeIntegralInRange<size_t>(1, left)
                          : in.ConsumeIntegralInRange<size_t>(0, 4096);
        const char fill = char(in.ConsumeIntegral<uint8_t>() | 1);  // never all zeros
        std::string chunk(size, fill);
        for (size_t j = 0; j < chunk.size(); j += 97) chunk[j] = char(j);
        sent += chunk;
        m.set_chunk(std::move(chunk));
      }
    }
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  fuzz::Check(s, "UploadMatrix");
  if (cancelled) {  // the server sees it a moment later: then the quota must come back
    const auto give_up = std::chrono::steady_clock::now() + fuzz::kCallDeadline;
    while (ClientBytes(client) != 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        fuzz::Fail("a cancelled upload kept its quota", "");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return;
  }
  if (s.ok()) {
    if (headers != 1 || !header_first || exact != sent.size()) {
      fuzz::Fail("UploadMatrix accepted a malformed sequence", info.handle());
    }
    if (info.rows() != rows || info.cols() != cols || info.bytes() != exact) {
      fuzz::Fail("UploadMatrix describes another matrix", info.handle());
    }
    if (Download(client, info.handle()) != sent) {
      fuzz::Fail("the download differs from the upload", "");
    }
    Release(client, info.handle());
  }
  if (ClientBytes(client) != 0) {
    fuzz::Fail("resident bytes changed", s.ok() ? "after release" : s.error_message());
  }
}

}  // namespace
}  // namespace hgemm

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  for (int upload = 0; upload < 4 && in.remaining_bytes() > 0; ++upload) hgemm::Upload(in);
  return 0;
}
