#include "client/ring_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "client/error_details.h"

namespace hgemm {
namespace {

// The longest a waiting thread sleeps without looking (a lost wake-up costs this).
constexpr int64_t kMaxSleepNs = 10'000'000;
// How far around the predicted completion the reaper polls: a futex timeout overshoots by up to
// the timer slack (50 µs by default), and GEMM times jitter.
constexpr std::chrono::microseconds kPollMargin(150);

grpc::Status ToStatus(const RingCompletion& completion) {
  if (completion.code == 0) return grpc::Status::OK;  // a kept C's handle is no message
  const int code = completion.code > 0 && completion.code <= 16 ? completion.code
                                                                : int(grpc::StatusCode::UNKNOWN);
  const size_t length = strnlen(completion.message, sizeof(completion.message));
  return grpc::Status(grpc::StatusCode(code), std::string(completion.message, length));
}

// A completion the client answers itself (the entry never reached the server).
RingCompletion LocalCompletion(uint64_t ticket, grpc::StatusCode code, const char* message) {
  RingCompletion completion{};
  completion.user_data = ticket;
  completion.code = int32_t(code);
  std::snprintf(completion.message, sizeof(completion.message), "%s", message);
  return completion;
}

void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

std::chrono::steady_clock::time_point DeadlineOf(const RingSubmission& entry) {
  return std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(int64_t(std::min<uint64_t>(entry.deadline_ns, INT64_MAX))));
}

}  // namespace

std::unique_ptr<RingClient> RingClient::Attach(const GemmClient& client,
                                               const std::vector<std::string>& regions,
                                               const std::vector<std::string>& matrices,
                                               const RingClientOptions& options,
                                               grpc::Status* status) {
  std::string error;
  std::unique_ptr<SharedRegion> memory =
      SharedRegion::Create(int64_t(RingBytes(options.sq_entries, options.cq_entries)), &error);
  if (!memory) {
    *status = grpc::Status(grpc::StatusCode::INTERNAL, "the ring's memory: " + error);
    return nullptr;
  }
  RingHeader* header = reinterpret_cast<RingHeader*>(memory->data());
  header->magic = kRingMagic;
  header->version = kRingVersion;
  v1::RegionInfo info;
  *status = client.RegisterRegion(memory->path(), memory->bytes(), "ring", &info, options.call);
  if (!status->ok()) return nullptr;
  std::unique_ptr<RingClient> ring(new RingClient(client, std::move(memory), options));
  ring->region_ = info.region();
  ring->regions_ = regions;
  ring->matrices_ = matrices;

  // The attach call lives as long as the ring: the options' timeout is not its deadline.
  if (!options.call.client_id.empty()) {
    ring->attach_context_.AddMetadata("x-client-id", options.call.client_id);
  }
  if (!options.call.traceparent.empty()) {
    ring->attach_context_.AddMetadata("traceparent", options.call.traceparent);
  }
  v1::AttachRingRequest request;
  request.set_ring_region(ring->region_);
  request.set_sq_entries(options.sq_entries);
  request.set_cq_entries(options.cq_entries);
  for (const std::string& region : regions) request.add_regions(region);
  for (const std::string& matrix : matrices) request.add_matrices(matrix);
  ring->stub_ = v1::GemmService::NewStub(client.ChannelTo(""));
  ring->attach_call_ = ring->stub_->AttachRing(&ring->attach_context_, request);
  v1::RingEvent event;
  if (!ring->attach_call_->Read(&event) || !event.has_attached()) {
    *status = ring->attach_call_->Finish();
    if (status->ok()) {
      *status = grpc::Status(grpc::StatusCode::INTERNAL, "AttachRing ended without attaching");
    }
    ring->attach_call_.reset();
    return nullptr;  // the destructor unregisters the region
  }
  ring->attached_ = event.attached();
  RingClient* self = ring.get();
  ring->watcher_ = std::thread([self] {
    v1::RingEvent more;
    while (self->attach_call_->Read(&more)) {
    }
    const grpc::Status end = self->attach_call_->Finish();
    // UNAVAILABLE whatever ended it: the GEMM itself was not at fault, and the gRPC path (or
    // a new ring) may serve it.
    const std::string why =
        end.ok() ? "the server ended the ring"
                 : fmt::format("AttachRing ended with {}: {}",
                               StatusCodeName(int(end.error_code())), end.error_message());
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->detached_ =
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "the ring was detached (" + why + ")");
      self->detached_flag_.store(true);
    }
    self->changed_.notify_all();
    RingWakeSleeper(&self->header()->client_sleeping);
  });
  *status = grpc::Status::OK;
  return ring;
}

RingClient::RingClient(const GemmClient& client, std::unique_ptr<SharedRegion> memory,
                       const RingClientOptions& options)
    : client_(client),
      memory_(std::move(memory)),
      options_(options),
      sq_(reinterpret_cast<RingSubmission*>(memory_->data() + RingSqOffset())),
      cq_(reinterpret_cast<const RingCompletion*>(memory_->data() +
                                                  RingCqOffset(options.sq_entries))) {}

RingClient::~RingClient() {
  if (watcher_.joinable()) {
    attach_context_.TryCancel();
    watcher_.join();
  }
  if (region_.empty()) return;
  // The server lets go of the ring's region once its ring thread has ended and its GEMMs in
  // flight are answered: moments after the call ends.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (client_.UnregisterRegion(region_, options_.call).error_code() ==
             grpc::StatusCode::FAILED_PRECONDITION &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

grpc::Status RingClient::detached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return detached_;
}

bool RingClient::HasRegion(const std::string& region) const {
  std::lock_guard<std::mutex> lock(slots_mu_);
  return std::find(regions_.begin(), regions_.end(), region) != regions_.end();
}

bool RingClient::HasMatrix(const std::string& matrix) const {
  std::lock_guard<std::mutex> lock(slots_mu_);
  return std::find(matrices_.begin(), matrices_.end(), matrix) != matrices_.end();
}

std::string RingClient::KeptHandle(const RingCompletion& completion) {
  return std::string(completion.message, strnlen(completion.message, sizeof(completion.message)));
}

grpc::Status RingClient::Bind(const std::vector<std::string>& regions,
                              const std::vector<std::string>& matrices) {
  std::lock_guard<std::mutex> lock(slots_mu_);
  v1::BindRingSlotsRequest request;
  request.set_ring_region(region_);
  auto unbound = [](const std::vector<std::string>& bound, const std::string& handle) {
    return std::find(bound.begin(), bound.end(), handle) == bound.end();
  };
  for (const std::string& region : regions) {
    if (unbound(regions_, region)) request.add_regions(region);
  }
  for (const std::string& matrix : matrices) {
    if (unbound(matrices_, matrix)) request.add_matrices(matrix);
  }
  if (request.regions().empty() && request.matrices().empty()) return grpc::Status::OK;
  grpc::ClientContext context;
  if (!options_.call.client_id.empty()) context.AddMetadata("x-client-id", options_.call.client_id);
  if (options_.call.timeout.count() > 0) {
    context.set_deadline(std::chrono::system_clock::now() + options_.call.timeout);
  }
  v1::RingSlots slots;
  grpc::Status s = stub_->BindRingSlots(&context, request, &slots);
  if (!s.ok()) return s;
  // Slots are appended after the server's last one, which is ours: this mutex orders binds.
  if (slots.first_region_slot() != regions_.size() ||
      slots.first_matrix_slot() != matrices_.size()) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        fmt::format("BindRingSlots answered slots {} and {}; the client has {} "
                                    "and {} bound",
                                    slots.first_region_slot(), slots.first_matrix_slot(),
                                    regions_.size(), matrices_.size()));
  }
  regions_.insert(regions_.end(), request.regions().begin(), request.regions().end());
  matrices_.insert(matrices_.end(), request.matrices().begin(), request.matrices().end());
  return grpc::Status::OK;
}

int RingClient::KernelIndex(const std::string& name) const {
  if (name.empty() || name == "auto") return 0;
  for (int i = 0; i < attached_.kernels_size(); ++i) {
    if (attached_.kernels(i) == name) return i + 1;
  }
  return -1;
}

grpc::Status RingClient::ToSubmission(const v1::GemmRequest& request, const std::string& c_matrix,
                                      std::chrono::microseconds timeout,
                                      RingSubmission* entry) const {
  auto invalid = [](const std::string& field, const std::string& why) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, field + ": " + why);
  };
  if (!request.a().empty() || !request.b().empty() || !request.c_in().empty()) {
    return invalid("a", "a ring entry carries no bytes: name operands by region or handle");
  }
  if (request.keep_c_resident() && (request.has_c_region() || !c_matrix.empty())) {
    return invalid("keep_c_resident", "C goes either to a region or stays resident, not both");
  }
  if (request.c_ttl_seconds() != 0 || request.c_transient()) {
    return invalid(request.c_transient() ? "c_transient" : "c_ttl_seconds",
                   "a C kept through a ring has the server's default TTL");
  }
  if (request.batch() > 1 || request.group_size() > 0) {
    return invalid("batch", "a ring entry is one GEMM");
  }
  auto slot = [](const std::vector<std::string>& bound, const std::string& handle) {
    const auto it = std::find(bound.begin(), bound.end(), handle);
    return it == bound.end() ? -1 : int(it - bound.begin());
  };
  // {kind, slot, offset} of a region or a handle.
  auto operand = [&](const char* field, bool has_region, const v1::RegionRef& region,
                     const std::string& handle, RingOperand* out) -> grpc::Status {
    if (has_region) {
      const int i = slot(regions_, region.region());
      if (i < 0) return invalid(field, "region " + region.region() + " is bound to no slot");
      *out = {kRingOperandRegion, uint32_t(i), region.offset()};
    } else if (!handle.empty()) {
      const int i = slot(matrices_, handle);
      if (i < 0) return invalid(field, "matrix " + handle + " is bound to no slot");
      *out = {kRingOperandMatrix, uint32_t(i), 0};
    }
    return grpc::Status::OK;
  };
  *entry = RingSubmission{};
  entry->m = request.m();
  entry->n = request.n();
  entry->k = request.k();
  entry->flags = (request.transpose_a() ? kRingTransposeA : 0) |
                 (request.transpose_b() ? kRingTransposeB : 0) |
                 (request.has_alpha() ? kRingHasAlpha : 0) |
                 (request.keep_c_resident() ? kRingKeepC : 0);
  entry->dtype = uint32_t(request.dtype());
  entry->c_dtype = uint32_t(request.c_dtype());
  entry->accumulation = uint32_t(request.options().accumulation());
  const int kernel = KernelIndex(request.options().kernel());
  if (kernel < 0) {
    return invalid("options.kernel", "the server has no kernel " + request.options().kernel());
  }
  entry->kernel = uint32_t(kernel);
  entry->alpha = request.alpha();
  entry->beta = request.beta();
  if (timeout.count() > 0) {
    entry->flags |= kRingHasDeadline;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    entry->deadline_ns = uint64_t(
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count());
  }
  std::lock_guard<std::mutex> lock(slots_mu_);
  grpc::Status s =
      operand("a", request.has_a_region(), request.a_region(), request.a_handle(), &entry->a);
  if (s.ok()) {
    s = operand("b", request.has_b_region(), request.b_region(), request.b_handle(), &entry->b);
  }
  if (s.ok()) {
    s = operand("c_in", request.has_c_in_region(), request.c_in_region(), request.c_in_handle(),
                &entry->c_in);
  }
  if (s.ok() && !request.keep_c_resident()) {
    s = operand("c", request.has_c_region(), request.c_region(), c_matrix, &entry->c);
  }
  return s;
}

uint64_t RingClient::Submit(const RingSubmission& gemm) {
  std::lock_guard<std::mutex> lock(submit_mu_);
  const uint64_t ticket = next_ticket_++;
  const uint32_t mask = options_.sq_entries - 1;
  while (sq_tail_ - header()->sq_head.load(std::memory_order_acquire) >= options_.sq_entries) {
    if (detached_flag_.load()) return ticket;  // never sent: Wait answers with the reason
    if ((gemm.flags & kRingHasDeadline) != 0 &&
        DeadlineOf(gemm) <= std::chrono::steady_clock::now()) {
      std::lock_guard<std::mutex> done_lock(mu_);
      done_[ticket] = LocalCompletion(ticket, grpc::StatusCode::DEADLINE_EXCEEDED,
                                      "the deadline passed while the ring's submission queue "
                                      "was full");
      return ticket;
    }
    TryReap();  // the server takes no more while the completion queue is full
    std::this_thread::yield();
  }
  RingSubmission& entry = sq_[sq_tail_ & mask];
  entry = gemm;
  entry.user_data = ticket;
  header()->sq_tail.store(++sq_tail_);
  submitted_.fetch_add(1);
  RingWakeSleeper(&header()->server_sleeping);
  return ticket;
}

grpc::Status RingClient::Wait(uint64_t ticket, RingCompletion* completion,
                              std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (auto it = done_.find(ticket); it != done_.end()) {
      if (completion != nullptr) *completion = it->second;
      grpc::Status s = ToStatus(it->second);
      done_.erase(it);
      return s;
    }
    if (detached_flag_.load()) return detached_;
    if (std::chrono::steady_clock::now() >= deadline) {
      abandoned_.insert(ticket);  // Reap drops its completion
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "the ring GEMM did not complete by its deadline (its C may still be "
                          "written until its late completion: RingClient::Drain)");
    }
    if (reaping_) {
      if (deadline == std::chrono::steady_clock::time_point::max()) {
        changed_.wait(lock);
      } else {
        changed_.wait_until(lock, deadline);
      }
      continue;
    }
    reaping_ = true;
    lock.unlock();
    AwaitCompletions(deadline);
    Reap();
    lock.lock();
    reaping_ = false;
    changed_.notify_all();
  }
}

grpc::Status RingClient::Gemm(const RingSubmission& gemm, RingCompletion* completion) {
  const auto deadline = (gemm.flags & kRingHasDeadline) != 0
                            ? DeadlineOf(gemm)
                            : std::chrono::steady_clock::time_point::max();
  return Wait(Submit(gemm), completion, deadline);
}

grpc::Status RingClient::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  while (reaped_.load() != submitted_.load()) {
    if (detached_flag_.load()) return detached_;
    if (reaping_) {
      changed_.wait(lock);
      continue;
    }
    reaping_ = true;
    lock.unlock();
    AwaitCompletions(std::chrono::steady_clock::time_point::max());
    Reap();
    lock.lock();
    reaping_ = false;
    changed_.notify_all();
  }
  return grpc::Status::OK;
}

void RingClient::TryReap() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reaping_) return;
    reaping_ = true;
  }
  Reap();
  std::lock_guard<std::mutex> lock(mu_);
  reaping_ = false;
  changed_.notify_all();
}

void RingClient::Reap() {
  RingHeader* h = header();
  const uint32_t tail = h->cq_tail.load(std::memory_order_acquire);
  if (tail == cq_head_) return;
  // The server may be waiting for room in the completion queue: all of it could be ours.
  const bool server_may_wait = submitted_.load() - reaped_.load() >= options_.cq_entries;
  std::vector<RingCompletion> reaped;
  for (; cq_head_ != tail; ++cq_head_) reaped.push_back(cq_[cq_head_ & (options_.cq_entries - 1)]);
  h->cq_head.store(cq_head_, std::memory_order_release);
  reaped_.fetch_add(reaped.size());
  if (server_may_wait) RingWakeSleeper(&h->server_sleeping);
  std::lock_guard<std::mutex> lock(mu_);
  for (const RingCompletion& c : reaped) {
    if (abandoned_.erase(c.user_data) == 0) done_[c.user_data] = c;
  }
}

void RingClient::AwaitCompletions(std::chrono::steady_clock::time_point deadline) {
  RingHeader* h = header();
  const auto start = std::chrono::steady_clock::now();
  const auto spin_until = start + std::chrono::microseconds(options_.spin_us);
  const auto expected = start + last_wait_;
  while (h->cq_tail.load(std::memory_order_acquire) == cq_head_ && !detached_flag_.load()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return;
    if (now < spin_until || (now >= expected - kPollMargin && now < expected + kPollMargin)) {
      CpuRelax();
      continue;
    }
    // Until the predicted completion's window, else the deadline; a completion wakes it.
    const auto wake =
        now < expected - kPollMargin ? std::min(expected - kPollMargin, deadline) : deadline;
    const int64_t left_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(wake - now).count();
    h->client_sleeping.store(1);
    if (h->cq_tail.load() == cq_head_ && !detached_flag_.load()) {
      RingFutexWait(&h->client_sleeping, 1, std::max<int64_t>(1, std::min(kMaxSleepNs, left_ns)));
    }
    h->client_sleeping.store(0);
  }
  if (!detached_flag_.load()) last_wait_ = std::chrono::steady_clock::now() - start;
}

}  // namespace hgemm
