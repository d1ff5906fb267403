// libFuzzer target for the submission ring's server side (RingExecutor): the input is what a
// hostile same-host client writes into its ring, entry by entry and word by word, while the
// server serves it. Each execution attaches a ring (a real memfd, registered as a region, with
// a data region and an unbound matrix as slots), plays the ops the input draws (write an entry
// made of the input's bytes with boundary dimensions, kinds, slots and offsets mixed in;
// publish the SQ tail, sometimes far ahead; scribble a header word; reap completions; entries
// may keep C (kRingKeepC: the kept matrix is released when reaped) or carry a deadline around
// now (kRingHasDeadline), and some bind more slots (RingExecutor::Bind, as BindRingSlots),
// all drawn from the entry's own bytes so that the corpus decodes as before), then stops the
// ring. Besides "no crash" (ASan: no access outside the mappings), it checks that
// every completion carries a code in 0..16, a NUL-terminated message and an execution only when
// OK (a kernel of the ring's table, FP16 or FP32 accumulation), that a detach says
// why (INVALID_ARGUMENT naming sq_tail or cq_head), and that once stopped the ring lets go of
// its region within kCallDeadline (its thread never blocks; its GEMMs complete).
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "server/backend/cpu_backend.h"
#include "server/fuzz/fuzz_util.h"
#include "server/session/ring_executor.h"
#include "server/testing/core_regions.h"
#include "server/testing/memfd.h"

namespace hgemm::fuzz {
namespace {

constexpr uint32_t kEntries = 8;
constexpr int64_t kDataBytes = 64 << 10;

// A memfd of this process, mapped here and registered for "fuzz".
struct Mapped {
  Mapped(GemmCore& core, int64_t bytes) : file(bytes), bytes(bytes) {
    if (file.fd() < 0) Fail("memfd", "cannot make one");
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd(), 0);
    if (p == MAP_FAILED) Fail("mmap", "cannot map the memfd");
    base = static_cast<uint8_t*>(p);
    RegionInfo info;
    if (absl::Status s =
            RegisterMemfdNow(core, "fuzz", ThisProcess(), file.path(), bytes, "fuzz", &info);
        !s.ok()) {
      Fail("Register", std::string(s.message()));
    }
    handle = info.handle;
  }
  TestMemfd file;
  int64_t bytes;
  uint8_t* base = nullptr;
  std::string handle;
};

struct Services {
  Services()
      : backend(MakeCpuBackend({.workers = kCpuWorkers,
                                .max_job_bytes = kBackendBytes,
                                .resident_budget_bytes = kBackendBytes})),
        store(backend.get(), {.quota_bytes_per_client = kQuotaBytesPerClient}),
        scheduler(backend.get(), {.idle_spin = std::chrono::microseconds(0)}),
        uploads(backend.get(), kUploadThreads),
        core(&scheduler, backend.get(), &store, &uploads,
             {.rules = {.max_elements_per_matrix = kMaxElementsPerMatrix,
                        .kernels = backend->Kernels()},
              .regions = {.allow_shared_memory = true}}),
        rings({.spin_us = 0, .max_in_flight = 4, .max_rings_per_owner = 4}),
        data(core, kDataBytes),
        ring(core, int64_t(RingBytes(kEntries, kEntries))) {}
  std::unique_ptr<Backend> backend;
  MatrixStore store;
  Scheduler scheduler;
  UploadQueue uploads;
  GemmCore core;
  RingRegistry rings;
  Mapped data;
  Mapped ring;
};

Services& Get() {
  static Services* services = new Services;  // never destroyed: the fuzzer ends the process
  return *services;
}

RingOperand Operand(FuzzedDataProvider& in) {
  RingOperand o{};
  o.kind =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 3) : in.ConsumeIntegral<uint32_t>();
  o.slot =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 2) : in.ConsumeIntegral<uint32_t>();
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
      o.offset = 16 * in.ConsumeIntegralInRange<uint64_t>(0, kDataBytes / 16);
      break;
    case 1:
      o.offset = 2 * in.ConsumeIntegralInRange<uint64_t>(0, kDataBytes / 2);
      break;
    case 2:
      o.offset = UINT64_MAX - in.ConsumeIntegralInRange<uint64_t>(0, 4096);
      break;
    default:
      o.offset = in.ConsumeIntegral<uint64_t>();
  }
  return o;
}

bool Detached(std::mutex& mu, const std::optional<std::string>& detached) {
  std::lock_guard<std::mutex> lock(mu);
  return detached.has_value();
}

// Waiting for the server's threads (the ring's, the scheduler's), which run meanwhile: yield
// the core at first (most waits end within a few yields), then sleep briefly.
void Pause(int polls) {
  if (polls < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace
}  // namespace hgemm::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hgemm;
  using namespace hgemm::fuzz;
  Services& s = Get();
  FuzzedDataProvider in(data, size);
  RingHeader* h = reinterpret_cast<RingHeader*>(s.ring.base);
  std::memset(s.ring.base, 0, s.ring.bytes);
  h->magic = kRingMagic;
  h->version = kRingVersion;
  std::mutex mu;
  std::optional<std::string> detached;  // guarded by mu
  std::shared_ptr<RingExecutor> executor;
  absl::Status attached = RingExecutor::Attach(
      &s.core, &s.rings, "fuzz", true,
      {s.ring.handle, kEntries, kEntries, {s.data.handle}, {"m-unbound"}}, nullptr,
      [&](const absl::Status& reason) {
        std::lock_guard<std::mutex> lock(mu);
        if (reason.code() != absl::StatusCode::kInvalidArgument ||
            (reason.message().find("sq_tail") == absl::string_view::npos &&
             reason.message().find("cq_head") == absl::string_view::npos)) {
          Fail("a detach without its reason", std::string(reason.message()));
        }
        detached = std::string(reason.message());
      },
      &executor);
  if (!attached.ok()) Fail("Attach", std::string(attached.message()));
  auto* sq = reinterpret_cast<RingSubmission*>(s.ring.base + RingSqOffset());
  auto* cq = reinterpret_cast<RingCompletion*>(s.ring.base + RingCqOffset(kEntries));
  uint32_t tail = 0, head = 0;
  bool scribbled = false;
  auto reap = [&] {
    const uint32_t published = h->cq_tail.load();
    // This harness scribbles over the CQ tail too: a tail past the ring's size is its own.
    if (published - head > kEntries) head = published - kEntries;
    for (; head != published; ++head) {
      const RingCompletion& c = cq[head % kEntries];
      if (c.code < 0 || c.code > 16)
        Fail("a completion code outside 0..16", std::to_string(c.code));
      if (std::memchr(c.message, 0, sizeof(c.message)) == nullptr) {
        Fail("a completion message without its NUL", "");
      }
      // What ran it: only for a GEMM that ran, naming a kernel of the ring's table.
      if ((c.flags & ~uint32_t{kRingCompletionExecution}) != 0 ||
          ((c.flags & kRingCompletionExecution) != 0 &&
           (c.code != 0 || c.kernel > s.core.rules().kernels.size() ||
            (c.accumulation != kRingAccumulationFp16 &&
             c.accumulation != kRingAccumulationFp32)))) {
        Fail("a completion's execution", std::to_string(c.flags) + " " + std::to_string(c.kernel));
      }
      if (c.code == 0 && std::strncmp(c.message, "m-", 2) == 0) {  // a kept C
        int64_t freed = 0;
        s.store.Release("fuzz", c.message, &freed).IgnoreError();
      }
    }
    h->cq_head.store(head);
    RingWakeSleeper(&h->server_sleeping);
  };
  while (in.remaining_bytes() > 0) {
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
      case 1: {  // an entry
        RingSubmission e{};
        std::string raw = in.ConsumeBytesAsString(sizeof(e));
        std::memcpy(&e, raw.data(), raw.size());
        if (in.ConsumeBool()) {  // structured: dimensions and operands that may pass
          e.m = Dim(in);
          e.n = Dim(in);
          e.k = Dim(in);
          e.flags &=
              kRingTransposeA | kRingTransposeB | kRingHasAlpha | kRingKeepC | kRingHasDeadline;
          // A deadline from 1 ms ago to 1 ms ahead, from the entry's bytes.
          e.deadline_ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now().time_since_epoch())
                                       .count()) +
                          e.deadline_ns % 2000000 - 1000000;
          e.dtype %= 4;
          e.c_dtype %= 4;
          e.accumulation %= 3;
          e.kernel %= 3;
          e.timeout_us %= 1000000;
          e.a = Operand(in);
          e.b = Operand(in);
          e.c_in = Operand(in);
          e.c = Operand(in);
        }
        sq[tail % kEntries] = e;
        if (e.user_data % 8 == 0) {  // more slots, bound while the ring runs (or refused)
          uint32_t first_region = 0, first_matrix = 0;
          const absl::Status bound = executor->Bind({e.user_data % 16 == 0 ? s.data.handle : ""},
                                                    {"m-unbound"}, &first_region, &first_matrix);
          if (bound.ok() == (e.user_data % 16 != 0)) Fail("Bind", std::string(bound.message()));
        }
        break;
      }
      case 2:  // publish
        if (tail - h->sq_head.load() < kEntries) h->sq_tail.store(++tail);
        RingWakeSleeper(&h->server_sleeping);
        break;
      case 3: {  // scribble a header word
        scribbled = true;
        std::atomic<uint32_t>* words[] = {&h->sq_head, &h->sq_tail,         &h->cq_head,
                                          &h->cq_tail, &h->server_sleeping, &h->client_sleeping};
        words[in.ConsumeIntegralInRange<size_t>(0, 5)]->store(in.ConsumeIntegral<uint32_t>());
        RingWakeSleeper(&h->server_sleeping);
        break;
      }
      default:
        reap();
    }
  }
  // Let the server look at what this input left (take what was published, or detach on a
  // scribbled word), reaping so that the CQ has room: until it sleeps with nothing new to
  // take (its sleeping word, which it sets only after a last look at the SQ tail), or detaches.
  const auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  for (int polls = 0; !Detached(mu, detached) && std::chrono::steady_clock::now() < settle;
       ++polls) {
    if (h->cq_tail.load() != head) {
      reap();  // wakes the server if it waits for room
    } else if (h->server_sleeping.load() == 1 && (scribbled || h->sq_head.load() == tail)) {
      break;
    }
    Pause(polls);
  }
  executor->Stop();
  // Stop wakes the ring thread only through the sleeping word, which this input may have
  // cleared: a client may always wake it (else it sleeps out its 10 ms futex wait).
  RingFutexWake(&h->server_sleeping);
  executor.reset();
  // The ring thread ends and its GEMMs complete: then the ring's region has no lease left.
  const auto give_up = std::chrono::steady_clock::now() + kCallDeadline;
  for (int polls = 0;; ++polls) {
    int64_t leases = -1;
    RegionList listed;
    if (absl::Status listing = s.core.ListRegions("fuzz", /*over_unix_socket=*/true, &listed);
        !listing.ok()) {
      Fail("ListRegions", std::string(listing.message()));
    }
    for (const RegionInfo& r : listed.regions) {
      if (r.handle == s.ring.handle) leases = r.leases;
    }
    if (leases == 0) break;
    if (std::chrono::steady_clock::now() > give_up) {
      Fail("a stopped ring still holds its region", std::to_string(leases) + " leases");
    }
    Pause(polls);
  }
  reap();  // what completed after the stop
  return 0;
}
