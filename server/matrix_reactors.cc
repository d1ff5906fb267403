#include "server/matrix_reactors.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/convert.h"
#include "server/core/status.h"
#include "server/status_util.h"

namespace hgemm {

// UploadMatrix: the header reserves the matrix's quota and has it allocated where it will
// live, on an upload thread; each chunk is handed to the upload queue as it arrives (held
// until the allocation is done); the matrix is registered once the client is done and every
// copy has landed.
class UploadMatrixReactor final : public grpc::ServerReadReactor<v1::UploadMatrixRequest>,
                                  public GemmServiceImpl::TrackedCall {
 public:
  UploadMatrixReactor(GemmServiceImpl& service, grpc::CallbackServerContext* context,
                      std::string owner, v1::MatrixInfo* response)
      : service_(service),
        context_(context),
        owner_(std::move(owner)),
        response_(response) {
    StartRead(&request_);
    service_.Track(this);
  }

  void OnReadDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reads_done_) return;  // timed out meanwhile: nothing more is read
      reading_ = true;  // the message is being acted on: the call can't finish under it
      last_read_ = Clock::now();
    }
    absl::Status s;
    bool more = false;
    try {
      if (!ok) {  // the client has sent everything (or went away)
        if (!header_seen_) {
          s = status::InvalidArgument("header", "no header was sent");
        } else if (received_ != bytes_) {
          s = status::InvalidArgument(
              "chunk", fmt::format("the stream ended after {} of the matrix's {} bytes",
                                   received_, bytes_));
        }
      } else {
        s = header_seen_ ? ConsumeChunk() : ConsumeHeader();
        more = s.ok();
      }
    } catch (...) {
      s = status::FromCurrentException("UploadMatrix");
      more = false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = false;
    if (more && !reads_done_) return StartRead(&request_);
    if (error_.ok()) error_ = s;  // not over a failed allocation's reason
    reads_done_ = true;
    MaybeFinishLocked();
  }

  void OnDone() override {
    service_.Untrack(this);
    {
      std::lock_guard<std::mutex> lock(mu_);  // whoever called Finish has let go of mu_
      // Only now is IsCancelled() exact: a cancellation can reach the reactor after the reads
      // ended and the matrix was registered; the client never learns that handle.
      if (!registered_.empty() && context_->IsCancelled()) {
        int64_t freed = 0;
        service_.store_->Release(owner_, registered_, &freed);
      }
    }
    delete this;
  }

  void Drain() override {}  // an upload in progress gets the drain deadline

  void ExpireIdle(Clock::time_point cutoff) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (reads_done_ || reading_ || last_read_ >= cutoff) return;
    error_ = status::Idle(fmt::format("UploadMatrix: no message for {} s; the upload was dropped",
                                      service_.options_.idle_timeout.count()));
    reads_done_ = true;  // the read outstanding completes after Finish, and is ignored
    MaybeFinishLocked();
  }

 private:
  absl::Status ConsumeHeader() {
    if (!request_.has_header()) {
      return status::InvalidArgument("header", "the first message must be a header");
    }
    header_ = request_.header();
    GemmShape shape;  // validate rows x cols as the m x k of a GEMM
    if (header_.rows() == 0) return status::InvalidArgument("header.rows", "must be at least 1");
    if (header_.cols() == 0) return status::InvalidArgument("header.cols", "must be at least 1");
    if (absl::Status s = ValidateShape(header_.rows(), 1, header_.cols(), service_.options_.rules,
                                       &shape);
        !s.ok()) {
      return s;
    }
    if (header_.label().size() > kMaxRequestIdBytes) {
      return status::InvalidArgument("header.label", "at most 128 bytes");
    }
    int device_index = -1;
    if (header_.has_device_id()) {
      const auto devices = service_.backend_->Devices();
      auto it = std::find_if(devices.begin(), devices.end(),
                             [&](const DeviceDescription& d) { return d.id == header_.device_id(); });
      if (it == devices.end()) {
        return status::InvalidArgument("header.device_id",
                                       fmt::format("no device {} on this server", header_.device_id()));
      }
      device_index = int(it - devices.begin());
    }
    bytes_ = MatrixBytes(header_.rows(), header_.cols());
    if (absl::Status s = service_.store_->Reserve(owner_, bytes_, &quota_); !s.ok()) return s;
    header_seen_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      tally_.emplace(bytes_);
      allocating_ = true;
    }
    service_.uploads_->Post([this, device_index] {
      std::shared_ptr<ResidentBuffer> buffer;
      absl::Status s;
      try {
        s = service_.store_->AllocateBuffer(device_index, bytes_, &buffer);
      } catch (...) {
        s = status::FromCurrentException("UploadMatrix");
      }
      Allocated(s, std::move(buffer));
    });
    return absl::OkStatus();
  }

  // On an upload thread: the matrix's buffer (or why there is none). Copies the chunks that
  // came meanwhile, or ends the call.
  void Allocated(const absl::Status& s, std::shared_ptr<ResidentBuffer> buffer) {
    std::lock_guard<std::mutex> lock(mu_);
    allocating_ = false;
    if (!s.ok()) {
      early_chunks_.clear();
      if (error_.ok()) error_ = s;
      reads_done_ = true;  // the read outstanding completes after Finish, and is ignored
      return MaybeFinishLocked();
    }
    buffer_ = std::move(buffer);
    for (auto& [offset, data] : early_chunks_) CopyLocked(offset, std::move(data));
    early_chunks_.clear();
    MaybeFinishLocked();
  }

  absl::Status ConsumeChunk() {
    if (!request_.has_chunk()) return status::InvalidArgument("header", "sent twice");
    const int64_t size = request_.chunk().size();
    if (received_ + size > bytes_) {
      return status::InvalidArgument(
          "chunk", fmt::format("past the end: {} + {} bytes of a {}-byte matrix", received_, size,
                               bytes_));
    }
    if (service_.metrics_ != nullptr) service_.metrics_->AddReceivedBytes(Rpc::kUploadMatrix, size);
    std::lock_guard<std::mutex> lock(mu_);
    if (buffer_) {
      CopyLocked(received_, std::move(*request_.mutable_chunk()));
    } else if (allocating_) {
      early_chunks_.emplace_back(received_, std::move(*request_.mutable_chunk()));
    }  // else the allocation failed: the call is ending
    received_ += size;
    return absl::OkStatus();
  }

  // Hands bytes at `offset` to the upload queue. REQUIRES: buffer_ is set.
  void CopyLocked(int64_t offset, std::string data) {
    const int64_t size = data.size();
    writes_in_flight_++;
    service_.uploads_->Write(buffer_, offset, std::move(data),
                             [this, size](const absl::Status& s, double copy_ms) {
                               std::lock_guard<std::mutex> lock(mu_);
                               tally_->Add(s, size, copy_ms);
                               writes_in_flight_--;
                               MaybeFinishLocked();
                             });
  }

  void MaybeFinishLocked() {
    if (finished_ || !reads_done_ || reading_ || allocating_ || writes_in_flight_ > 0) return;
    finished_ = true;
    absl::Status s = error_.ok() ? tally_->error() : error_;
    // A client that cancelled won't learn the handle: registering the matrix would leak it.
    if (s.ok() && context_->IsCancelled()) s = status::Cancelled();
    if (s.ok()) {
      ResidentMatrix m = service_.store_->Add(std::move(quota_), header_.rows(), header_.cols(),
                                              std::move(buffer_),
                                              std::chrono::seconds(header_.ttl_seconds()),
                                              header_.label());
      service_.Describe(m, response_);
      registered_ = m.handle;
    } else {  // given back before the client hears of it, so that it can retry at once
      quota_ = QuotaReservation();
      buffer_.reset();
    }
    service_.Answered(Rpc::kUploadMatrix, s, context_, owner_);
    Finish(ToGrpcStatus(s));
  }

  GemmServiceImpl& service_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  v1::MatrixInfo* const response_;
  v1::UploadMatrixRequest request_;  // the read in flight
  v1::MatrixHeader header_;
  bool header_seen_ = false;  // read path only
  int64_t bytes_ = 0;         // the matrix's, from the header on
  int64_t received_ = 0;
  QuotaReservation quota_;  // the matrix's bytes of the client's quota, from the header on
  std::string registered_;  // guarded by mu_; the handle, once the matrix is in the store

  std::mutex mu_;
  // Where the matrix goes: allocated after the header, moved into the store once the reads
  // are done. Chunks that arrive before it exists wait in early_chunks_ (offset, bytes).
  std::shared_ptr<ResidentBuffer> buffer_;  // guarded by mu_
  bool allocating_ = false;                 // guarded by mu_
  std::vector<std::pair<int64_t, std::string>> early_chunks_;  // guarded by mu_
  std::optional<WriteTally> tally_;         // guarded by mu_
  int64_t writes_in_flight_ = 0;            // guarded by mu_
  absl::Status error_;                      // guarded by mu_; a broken rule
  bool reads_done_ = false;                 // guarded by mu_
  bool reading_ = false;                    // guarded by mu_; a message is being acted on
  Clock::time_point last_read_ = Clock::now();  // guarded by mu_
  bool finished_ = false;                   // guarded by mu_
};

// DownloadMatrix: the device copy runs on an upload thread, then the chunks go out one by one.
class DownloadMatrixReactor final : public grpc::ServerWriteReactor<v1::ResultChunk> {
 public:
  DownloadMatrixReactor(const GemmServiceImpl& service, grpc::CallbackServerContext* context,
                        std::string owner, const v1::DownloadMatrixRequest& request)
      : service_(service),
        context_(context),
        owner_(std::move(owner)),
        chunk_bytes_(service.options_.stream_chunk_bytes),
        buffers_(service.result_buffers_) {
    ResidentMatrix m;
    absl::Status s = service.store_->Lookup(owner_, request.handle(), "handle", &m);
    if (!s.ok()) {
      Answer(s);
      return;
    }
    service.uploads_->Post([this, &service, buffer = m.buffer] {
      absl::Status read;
      try {
        data_ = buffers_.Take(buffer->bytes);
        read = service.backend_->ReadResident(*buffer, data_.data());
      } catch (...) {
        read = status::FromCurrentException("DownloadMatrix");
      }
      if (!read.ok()) return Answer(read);
      NextWrite();
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Answer(status::Cancelled());
    NextWrite();
  }

  void OnDone() override {
    buffers_.Give(std::move(data_));
    delete this;
  }

 private:
  void Answer(const absl::Status& s) {
    service_.Answered(Rpc::kDownloadMatrix, s, context_, owner_);
    Finish(ToGrpcStatus(s));
  }

  void NextWrite() {
    if (offset_ >= int64_t(data_.size())) return Answer(absl::OkStatus());
    const int64_t size = std::min<int64_t>(chunk_bytes_, data_.size() - offset_);
    if (service_.metrics_ != nullptr) service_.metrics_->AddSentBytes(Rpc::kDownloadMatrix, size);
    chunk_.set_offset(offset_);
    chunk_.set_data(data_.data() + offset_, size);
    chunk_.set_total_bytes(offset_ == 0 ? data_.size() : 0);
    offset_ += size;
    StartWrite(&chunk_);
  }

  const GemmServiceImpl& service_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  const int64_t chunk_bytes_;
  HostBufferPool& buffers_;
  std::string data_;
  int64_t offset_ = 0;
  v1::ResultChunk chunk_;
};

grpc::ServerReadReactor<v1::UploadMatrixRequest>* NewUploadMatrixReactor(
    GemmServiceImpl& service, grpc::CallbackServerContext* context, std::string owner,
    v1::MatrixInfo* response) {
  return new UploadMatrixReactor(service, context, std::move(owner), response);
}

grpc::ServerWriteReactor<v1::ResultChunk>* NewDownloadMatrixReactor(
    GemmServiceImpl& service, grpc::CallbackServerContext* context, std::string owner,
    const v1::DownloadMatrixRequest& request) {
  return new DownloadMatrixReactor(service, context, std::move(owner), request);
}

}  // namespace hgemm
