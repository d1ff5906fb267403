#include "server/session/ring_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string_view>
#include <utility>

#include "server/core/status.h"
#include "server/core/thread_name.h"
#include "server/session/validation.h"

namespace hgemm {
namespace {

// The longest a ring thread sleeps without looking (a wake-up lost to a hostile client costs
// this, nothing more).
constexpr int64_t kMaxSleepNs = 10'000'000;
// Entry timeouts past this are refused (it keeps the deadline's arithmetic far from overflow).
constexpr uint64_t kMaxTimeoutUs = uint64_t{24} * 3600 * 1000000;

bool PowerOfTwoUpTo(uint32_t n, uint32_t max) { return n >= 1 && n <= max && (n & (n - 1)) == 0; }

// Copies an entry out of memory the client may be writing: each word read exactly once.
RingSubmission CopyOut(const RingSubmission* shared) {
  static_assert(sizeof(RingSubmission) % sizeof(uint64_t) == 0);
  uint64_t words[sizeof(RingSubmission) / sizeof(uint64_t)];
  const volatile uint64_t* from = reinterpret_cast<const volatile uint64_t*>(shared);
  for (size_t i = 0; i < std::size(words); ++i) words[i] = from[i];
  RingSubmission entry;
  std::memcpy(&entry, words, sizeof(entry));
  return entry;
}

// An entry's DataType number as the core reads it; false for a number outside the enum.
bool FromRing(uint32_t number, WireEnum<ElementType>* type) {
  switch (number) {
    case kRingDataTypeUnspecified:
      *type = WireEnum<ElementType>::Unset();
      return true;
    case kRingDataTypeFp16:
      *type = WireEnum<ElementType>::Of(number, ElementType::kFp16);
      return true;
    case kRingDataTypeBf16:
      *type = WireEnum<ElementType>::Of(number, ElementType::kBf16);
      return true;
    case kRingDataTypeFp32:
      *type = WireEnum<ElementType>::Of(number, ElementType::kFp32);
      return true;
    default:
      return false;
  }
}

// An entry's Accumulation number as the core reads it; false for a number outside the enum.
bool FromRing(uint32_t number, WireEnum<Accumulation>* accumulation) {
  switch (number) {
    case kRingAccumulationUnspecified:
      *accumulation = WireEnum<Accumulation>::Unset();
      return true;
    case kRingAccumulationFp16:
      *accumulation = WireEnum<Accumulation>::Of(number, Accumulation::kFp16);
      return true;
    case kRingAccumulationFp32:
      *accumulation = WireEnum<Accumulation>::Of(number, Accumulation::kFp32);
      return true;
    default:
      return false;
  }
}

void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

RingRegistry::~RingRegistry() {
  std::unique_lock<std::mutex> lock(mu_);
  threads_ended_.wait(lock, [this] { return threads_ == 0; });
}

int64_t RingRegistry::Attached() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [owner, rings] : rings_) n += rings;
  return n;
}

absl::Status RingRegistry::Add(const std::string& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  int& rings = rings_[owner];
  if (rings >= options_.max_rings_per_owner) {
    if (rings == 0) rings_.erase(owner);
    return status::OverLimit(
        "max_rings_per_client",
        fmt::format("this client has {} rings attached (--max_rings_per_client)",
                    options_.max_rings_per_owner));
  }
  ++rings;
  return absl::OkStatus();
}

void RingRegistry::Index(const std::string& owner, const std::string& ring_region,
                         const std::shared_ptr<RingExecutor>& ring) {
  std::lock_guard<std::mutex> lock(mu_);
  by_region_[{owner, ring_region}] = ring;
}

void RingRegistry::Remove(const std::string& owner, const std::string& ring_region) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rings_.find(owner);
  if (it != rings_.end() && --it->second <= 0) rings_.erase(it);
  by_region_.erase({owner, ring_region});
}

absl::Status RingRegistry::Find(const std::string& owner, const std::string& ring_region,
                                std::shared_ptr<RingExecutor>* ring) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_region_.find({owner, ring_region});
  if (it != by_region_.end()) *ring = it->second.lock();
  if (it == by_region_.end() || *ring == nullptr) {
    return status::NotFound(
        fmt::format("ring_region: no ring of this client is attached over "
                    "region {}",
                    status::Quote(ring_region)));
  }
  return absl::OkStatus();
}

void RingRegistry::ThreadStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++threads_;
}

void RingRegistry::ThreadEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--threads_ == 0) threads_ended_.notify_all();
}

absl::Status RingExecutor::Attach(GemmCoreInterface* core, RingRegistry* registry,
                                  std::string owner, bool over_unix_socket, const RingSpec& spec,
                                  RingEntryObserver on_entry, RingDetached on_detached,
                                  std::shared_ptr<RingExecutor>* ring) {
  // First: a call that may not use shared memory learns that before anything of its spec.
  if (absl::Status s = core->CheckRegionsAllowed(over_unix_socket); !s.ok()) return s;
  if (!PowerOfTwoUpTo(spec.sq_entries, kRingMaxEntries)) {
    return status::InvalidArgument(
        "sq_entries",
        fmt::format("{} is not a power of two from 1 to {}", spec.sq_entries, kRingMaxEntries));
  }
  if (!PowerOfTwoUpTo(spec.cq_entries, kRingMaxEntries)) {
    return status::InvalidArgument(
        "cq_entries",
        fmt::format("{} is not a power of two from 1 to {}", spec.cq_entries, kRingMaxEntries));
  }
  for (size_t i = 0; i < spec.regions.size(); ++i) {
    if (spec.regions[i].empty()) {
      return status::InvalidArgument(fmt::format("regions[{}]", i), "empty region handle");
    }
  }
  for (size_t i = 0; i < spec.matrices.size(); ++i) {
    if (spec.matrices[i].empty()) {
      return status::InvalidArgument(fmt::format("matrices[{}]", i), "empty matrix handle");
    }
  }
  const uint32_t max_slots = registry->options().max_slots;
  if (spec.regions.size() > max_slots || spec.matrices.size() > max_slots) {
    return status::InvalidArgument(spec.regions.size() > max_slots ? "regions" : "matrices",
                                   fmt::format("more than {} slots", max_slots));
  }
  RegionLease lease;
  if (absl::Status s = core->LeaseRegion(owner, over_unix_socket, spec.ring_region, 0,
                                         int64_t(RingBytes(spec.sq_entries, spec.cq_entries)),
                                         "ring_region", &lease);
      !s.ok()) {
    return s;
  }
  if (lease.device_view()) {
    return status::InvalidArgument("ring_region", "a CUDA IPC region cannot hold a ring");
  }
  // Read once, here: after the attach nothing in the header but the atomics is looked at.
  const volatile RingHeader* header = reinterpret_cast<const volatile RingHeader*>(lease.data());
  const uint32_t magic = header->magic, version = header->version;
  if (magic != kRingMagic || version != kRingVersion) {
    return status::InvalidArgument(
        "ring_region", fmt::format("the ring's header has magic {:#x} and version {}; expected "
                                   "{:#x} and {} (proto/ring_layout.h)",
                                   magic, version, kRingMagic, kRingVersion));
  }
  if (absl::Status s = registry->Add(owner); !s.ok()) return s;
  auto executor =
      std::make_shared<RingExecutor>(core, registry, std::move(owner), over_unix_socket, spec,
                                     std::move(lease), std::move(on_entry), std::move(on_detached));
  registry->Index(executor->owner_, executor->ring_region_, executor);
  registry->ThreadStarted();
  try {
    std::thread([executor]() mutable {
      NameThisThread("hgemm-ring");
      RingRegistry* registry = executor->registry_;
      executor->Run();
      executor->ThreadDone();
      executor.reset();  // may be the last holder: the ring's lease goes back before the count
      registry->ThreadEnded();
    }).detach();
  } catch (...) {
    registry->ThreadEnded();
    executor->Unregister();
    return status::FromCurrentException("starting a ring thread");
  }
  *ring = std::move(executor);
  return absl::OkStatus();
}

RingExecutor::RingExecutor(GemmCoreInterface* core, RingRegistry* registry, std::string owner,
                           bool over_unix_socket, const RingSpec& spec, RegionLease ring,
                           RingEntryObserver on_entry, RingDetached on_detached)
    : core_(core),
      registry_(registry),
      owner_(std::move(owner)),
      over_unix_socket_(over_unix_socket),
      sq_entries_(spec.sq_entries),
      cq_entries_(spec.cq_entries),
      max_in_flight_(std::max<uint32_t>(1, registry->options().max_in_flight)),
      spin_us_(registry->options().spin_us),
      ring_region_(spec.ring_region),
      regions_(spec.regions),
      matrices_(spec.matrices),
      ring_(std::move(ring)),
      sq_(reinterpret_cast<const RingSubmission*>(ring_.data() + RingSqOffset())),
      cq_(reinterpret_cast<RingCompletion*>(ring_.data() + RingCqOffset(spec.sq_entries))),
      on_entry_(std::move(on_entry)),
      on_detached_(std::move(on_detached)) {
  // The server's own counts start where the client's do (a fresh ring has them at 0; any
  // other value only shifts both sides alike).
  RingHeader* h = header();
  sq_head_ = h->sq_tail.load(std::memory_order_acquire);
  h->sq_head.store(sq_head_, std::memory_order_release);
  cq_tail_ = h->cq_head.load(std::memory_order_acquire);
  h->cq_tail.store(cq_tail_, std::memory_order_release);
}

RingExecutor::~RingExecutor() { Unregister(); }

void RingExecutor::Unregister() {
  if (registered_.exchange(false)) registry_->Remove(owner_, ring_region_);
}

absl::Status RingExecutor::Bind(const std::vector<std::string>& regions,
                                const std::vector<std::string>& matrices, uint32_t* first_region,
                                uint32_t* first_matrix) {
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].empty()) {
      return status::InvalidArgument(fmt::format("regions[{}]", i), "empty region handle");
    }
  }
  for (size_t i = 0; i < matrices.size(); ++i) {
    if (matrices[i].empty()) {
      return status::InvalidArgument(fmt::format("matrices[{}]", i), "empty matrix handle");
    }
  }
  const uint32_t max_slots = registry_->options().max_slots;
  std::lock_guard<std::mutex> lock(slots_mu_);
  if (regions.size() > max_slots - regions_.size() ||
      matrices.size() > max_slots - matrices_.size()) {
    return status::OverLimit(
        "ring_slots",
        fmt::format("the ring would bind {} region and {} matrix slots, more than {} of either",
                    regions_.size() + regions.size(), matrices_.size() + matrices.size(),
                    max_slots));
  }
  *first_region = uint32_t(regions_.size());
  *first_matrix = uint32_t(matrices_.size());
  regions_.insert(regions_.end(), regions.begin(), regions.end());
  matrices_.insert(matrices_.end(), matrices.begin(), matrices.end());
  return absl::OkStatus();
}

void RingExecutor::Stop() {
  stopping_.store(true);
  // From the ring thread (on_detached_ itself stops the ring): the callback is taken already.
  if (thread_id_.load() != std::this_thread::get_id()) {
    std::lock_guard<std::mutex> lock(detach_mu_);
    on_detached_ = nullptr;
  }
  Unregister();
  std::lock_guard<std::mutex> lock(mu_);
  if (!ring_.empty()) RingWakeSleeper(&header()->server_sleeping);
}

void RingExecutor::ThreadDone() {
  std::lock_guard<std::mutex> lock(mu_);
  thread_done_ = true;
  ReleaseRingIfDoneLocked();
}

void RingExecutor::ReleaseRingIfDoneLocked() {
  if (thread_done_ && in_flight_ == 0) ring_.Release();
}

void RingExecutor::Detach(const absl::Status& reason) {
  stopping_.store(true);
  Unregister();
  std::lock_guard<std::mutex> lock(detach_mu_);
  if (RingDetached detached = std::exchange(on_detached_, nullptr)) detached(reason);
}

absl::Status RingExecutor::HasRoom(bool* room) {
  const uint32_t cq_head = header()->cq_head.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t unreaped = cq_tail_ - cq_head;
  if (unreaped > cq_entries_) {
    return status::InvalidArgument(
        "cq_head", fmt::format("{} is {} completions behind the server's tail {}, more than "
                               "the ring's {}",
                               cq_head, unreaped, cq_tail_, cq_entries_));
  }
  *room = in_flight_ < max_in_flight_ && unreaped + in_flight_ < cq_entries_;
  if (*room) ++in_flight_;  // the entry about to be taken
  return absl::OkStatus();
}

void RingExecutor::Run() {
  thread_id_.store(std::this_thread::get_id());
  RingHeader* h = header();
  const auto spin = std::chrono::microseconds(spin_us_);
  auto spin_until = Clock::now() + spin;
  while (!stopping_.load(std::memory_order_acquire)) {
    const uint32_t tail = h->sq_tail.load(std::memory_order_acquire);
    const uint32_t pending = tail - sq_head_;
    if (pending > sq_entries_) {
      Detach(status::InvalidArgument(
          "sq_tail", fmt::format("{} is {} entries ahead of the server's head {}, more than "
                                 "the ring's {}",
                                 tail, pending, sq_head_, sq_entries_)));
      return;
    }
    bool room = false;
    if (pending > 0) {
      if (absl::Status s = HasRoom(&room); !s.ok()) {
        Detach(s);
        return;
      }
    }
    if (room) {
      const RingSubmission entry = CopyOut(&sq_[sq_head_ & (sq_entries_ - 1)]);
      ++sq_head_;
      h->sq_head.store(sq_head_, std::memory_order_release);
      absl::Status s;
      try {
        s = Submit(entry);
      } catch (...) {
        s = status::FromCurrentException("ring entry");
      }
      if (!s.ok()) Complete(entry.user_data, s, nullptr, GemmShape{}, nullptr);
      spin_until = Clock::now() + spin;
      continue;
    }
    if (Clock::now() < spin_until) {
      CpuRelax();
      continue;
    }
    // Sleep until the client publishes or a completion wakes it (Complete: room, or the
    // client's next submission soon); the second look closes the race with a publish that did
    // not see the word yet.
    h->server_sleeping.store(1);
    const bool nothing_new = h->sq_tail.load() == tail;
    bool still_full = pending > 0;
    if (pending > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      const uint32_t cq_head = h->cq_head.load(std::memory_order_acquire);
      still_full = !(in_flight_ < max_in_flight_ && cq_tail_ - cq_head + in_flight_ < cq_entries_);
    }
    if (!stopping_.load() && (pending == 0 ? nothing_new : still_full)) {
      RingFutexWait(&h->server_sleeping, 1, kMaxSleepNs);
    }
    h->server_sleeping.store(0);
    spin_until = Clock::now() + spin;
  }
}

absl::Status RingExecutor::Submit(const RingSubmission& entry) {
  constexpr uint32_t kKnownFlags =
      kRingTransposeA | kRingTransposeB | kRingHasAlpha | kRingKeepC | kRingHasDeadline;
  if ((entry.flags & ~kKnownFlags) != 0) {
    return status::InvalidArgument("flags",
                                   fmt::format("unknown bits {:#x}", entry.flags & ~kKnownFlags));
  }
  GemmSpec spec{.m = entry.m,
                .n = entry.n,
                .k = entry.k,
                .transpose_a = (entry.flags & kRingTransposeA) != 0,
                .transpose_b = (entry.flags & kRingTransposeB) != 0,
                .beta = entry.beta,
                .keep_c_resident = (entry.flags & kRingKeepC) != 0};
  if (!FromRing(entry.dtype, &spec.dtype)) {
    return status::InvalidArgument("dtype", fmt::format("{} is not a DataType", entry.dtype));
  }
  if (!FromRing(entry.c_dtype, &spec.c_dtype)) {
    return status::InvalidArgument("c_dtype", fmt::format("{} is not a DataType", entry.c_dtype));
  }
  if (!FromRing(entry.accumulation, &spec.options.accumulation)) {
    return status::InvalidArgument("accumulation",
                                   fmt::format("{} is not an Accumulation", entry.accumulation));
  }
  const std::vector<KernelDescription>& kernels = core_->rules().kernels;
  if (entry.kernel > kernels.size()) {
    return status::InvalidArgument("kernel", fmt::format("index {}; RingAttached.kernels has {}",
                                                         entry.kernel, kernels.size()));
  }
  if (entry.kernel > 0) spec.options.kernel = kernels[entry.kernel - 1].name;
  if ((entry.flags & kRingHasAlpha) != 0) spec.alpha = entry.alpha;
  if (entry.timeout_us > kMaxTimeoutUs) {
    return status::InvalidArgument("timeout_us",
                                   fmt::format("{} is more than a day", entry.timeout_us));
  }
  // The entry's own deadline: one that passed while it waited in the SQ is not run at all.
  const auto now = Clock::now();
  auto deadline = Clock::time_point::max();
  if ((entry.flags & kRingHasDeadline) != 0) {
    if (entry.deadline_ns > uint64_t(INT64_MAX)) {
      return status::InvalidArgument("deadline_ns",
                                     fmt::format("{} is past 2^63 - 1", entry.deadline_ns));
    }
    deadline = Clock::time_point(std::chrono::nanoseconds(int64_t(entry.deadline_ns)));
    if (deadline <= now) return status::DeadlineExpired(0);
  }
  if (entry.timeout_us > 0) {
    deadline = std::min(deadline, now + std::chrono::microseconds(entry.timeout_us));
  }

  // One operand: its slot resolved into where its bytes are.
  auto bind = [&](const char* name, const RingOperand& operand, bool may_be_none,
                  OperandSource* source) -> absl::Status {
    switch (operand.kind) {
      case kRingOperandNone:
        if (may_be_none) return absl::OkStatus();
        return status::InvalidArgument(fmt::format("{}.kind", name),
                                       "needs a region or a matrix slot");
      case kRingOperandRegion:
        if (operand.slot >= regions_.size()) {
          return status::InvalidArgument(
              fmt::format("{}.slot", name),
              fmt::format("region slot {} is not bound (the ring binds {})", operand.slot,
                          regions_.size()));
        }
        *source = OperandSource::Region(regions_[operand.slot], operand.offset);
        return absl::OkStatus();
      case kRingOperandMatrix:
        if (operand.slot >= matrices_.size()) {
          return status::InvalidArgument(
              fmt::format("{}.slot", name),
              fmt::format("matrix slot {} is not bound (the ring binds {})", operand.slot,
                          matrices_.size()));
        }
        *source = OperandSource::Resident(matrices_[operand.slot]);
        return absl::OkStatus();
      default:
        return status::InvalidArgument(fmt::format("{}.kind", name),
                                       fmt::format("unknown kind {}", operand.kind));
    }
  };
  std::unique_lock<std::mutex> slots_lock(slots_mu_);
  if (absl::Status s = bind("a", entry.a, false, &spec.a); !s.ok()) return s;
  if (absl::Status s = bind("b", entry.b, false, &spec.b); !s.ok()) return s;
  if (absl::Status s = bind("c_in", entry.c_in, true, &spec.c_in); !s.ok()) return s;
  if (spec.keep_c_resident) {
    if (entry.c.kind != kRingOperandNone) {
      return status::InvalidArgument("c.kind", "C stays resident (kRingKeepC): name no C");
    }
  } else {
    OperandSource c;
    if (absl::Status s = bind("c", entry.c, false, &c); !s.ok()) return s;
    spec.c = c.kind == OperandSource::Kind::kRegion ? ResultSink::Region(c.handle, c.offset)
                                                    : ResultSink::IntoResident(c.handle);
  }
  slots_lock.unlock();
  GemmOrder order;
  if (absl::Status s = ValidateGemm(spec, core_->rules(), &order); !s.ok()) return s;
  order.over_unix_socket = over_unix_socket_;
  order.job.deadline = deadline;
  AdmittedGemm admitted;
  if (absl::Status s = core_->Admit(owner_, std::move(order), &admitted); !s.ok()) return s;
  const GemmShape shape = admitted.job().shape;
  return core_->Run(std::move(admitted), [self = shared_from_this(), user_data = entry.user_data,
                                          shape](const absl::Status& status, GemmResult result) {
    self->Complete(user_data, status, &result.report, shape,
                   result.kept_c.buffer ? &result.kept_c.handle : nullptr);
  });
}

uint16_t RingExecutor::KernelIndex(const std::string& kernel) const {
  const std::vector<KernelDescription>& kernels = core_->rules().kernels;
  for (size_t i = 0; i < kernels.size() && i < UINT16_MAX; ++i) {
    if (kernels[i].name == kernel) return uint16_t(i + 1);
  }
  return 0;
}

void RingExecutor::Complete(uint64_t user_data, absl::Status status, const GemmReport* report,
                            const GemmShape& shape, const std::string* kept_c) {
  if (status.ok() && kept_c != nullptr && kept_c->size() > kRingMaxHandleBytes) {
    // Never with the store's handles ("m-" and 32 hex digits); a C that could not be named
    // would stay in the store until its TTL.
    status =
        absl::InternalError(fmt::format("the kept C's handle has {} bytes, more than a ring "
                                        "completion holds",
                                        kept_c->size()));
  }
  RingCompletion completion{};
  completion.user_data = user_data;
  completion.code = int32_t(status.code());
  if (report != nullptr && status.ok()) {
    completion.queue_wait_ms = float(report->queue_wait_ms);
    completion.kernel_ms = float(report->kernel_ms);
    completion.server_total_ms = float(report->server_total_ms);
    completion.tflops = float(report->Tflops(shape));
    completion.flags |= kRingCompletionExecution;
    completion.kernel = KernelIndex(report->kernel);
    completion.accumulation = report->accumulation == Accumulation::kFp16
                                  ? uint16_t(kRingAccumulationFp16)
                                  : uint16_t(kRingAccumulationFp32);
    completion.device_id = int16_t(report->device_id);
    completion.stream_id = uint16_t(report->stream_id);
  }
  const std::string_view message =
      status.ok() && kept_c != nullptr
          ? std::string_view(*kept_c)
          : std::string_view(status.message().data(), status.message().size());
  const size_t length = std::min(message.size(), kRingMaxHandleBytes);
  if (length > 0) std::memcpy(completion.message, message.data(), length);  // OK: null
  {
    std::lock_guard<std::mutex> lock(mu_);
    RingHeader* h = header();
    std::memcpy(&cq_[cq_tail_ & (cq_entries_ - 1)], &completion, sizeof(completion));
    ++cq_tail_;
    h->cq_tail.store(cq_tail_, std::memory_order_release);
    --in_flight_;
    RingWakeSleeper(&h->client_sleeping);
    // Also when not waiting for room: a client waiting for this GEMM often submits its next
    // one at once, and the ring thread, polling again, takes it without a futex wake-up.
    RingWakeSleeper(&h->server_sleeping);
    ReleaseRingIfDoneLocked();
  }
  if (on_entry_) on_entry_(status.code());
}

}  // namespace hgemm
