#include "bench/hgemm_load.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <sys/resource.h>
#include <unistd.h>

#include "bench/load_callers.h"
#include "bench/stats.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"

namespace hgemm::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

// All samples of a point, in completion order. Thread-safe.
class LoadGenerator::Recorder {
 public:
  void Add(const Sample& s, const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back(s);
    if (s.code != 0 && first_error_.empty()) first_error_ = error;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_.size();
  }
  std::vector<Sample> Slice(size_t begin, size_t end) const {
    std::lock_guard<std::mutex> lock(mu_);
    end = std::min(end, samples_.size());
    return std::vector<Sample>(samples_.begin() + std::min(begin, end), samples_.begin() + end);
  }
  std::string first_error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Sample> samples_;  // guarded by mu_
  std::string first_error_;      // guarded by mu_
};

LoadGenerator::LoadGenerator(LoadOptions options) : options_(std::move(options)) {
  if (options_.client_id.empty()) options_.client_id = fmt::format("hgemm_load-{}", ::getpid());
  std::mt19937_64 rng(options_.seed);
  for (const Shape& shape : options_.shapes) {
    auto p = std::make_unique<Payload>();
    p->shape = shape;
    const GemmForm& form = options_.form;
    const std::vector<uint16_t> a = RandomHalfMatrix(int64_t(shape.m) * shape.k, rng, form.bf16);
    const std::vector<uint16_t> b = RandomHalfMatrix(int64_t(shape.k) * shape.n, rng, form.bf16);
    p->gemm.set_m(shape.m);
    p->gemm.set_n(shape.n);
    p->gemm.set_k(shape.k);
    p->gemm.set_transpose_a(form.transpose_a);
    p->gemm.set_transpose_b(form.transpose_b);
    p->gemm.set_dtype(form.bf16 ? v1::DATA_TYPE_BF16 : v1::DATA_TYPE_UNSPECIFIED);
    p->gemm.set_c_dtype(form.c_fp32 ? v1::DATA_TYPE_FP32 : v1::DATA_TYPE_UNSPECIFIED);
    p->gemm.set_a(reinterpret_cast<const char*>(a.data()), 2 * a.size());
    p->gemm.set_b(reinterpret_cast<const char*>(b.data()), 2 * b.size());
    p->gemm.mutable_options()->set_kernel(options_.kernel);
    p->gemm.mutable_options()->set_accumulation(options_.accumulation);
    p->gemm.mutable_options()->set_verify(options_.verify);
    p->gemm.mutable_options()->set_verify_repetitions(uint32_t(options_.verify_repetitions));
    std::string* payload = p->echo.mutable_payload();
    payload->reserve(SentBytes(shape, options_.resident));
    if (options_.resident != Resident::kAll) payload->append(p->gemm.a());
    if (options_.resident == Resident::kNone) payload->append(p->gemm.b());
    p->echo.set_reply_bytes(ReceivedBytes(shape, options_.resident));
    payloads_.push_back(std::move(p));
  }
}

LoadGenerator::~LoadGenerator() = default;

std::shared_ptr<grpc::Channel> LoadGenerator::MakeChannel(const std::string& target,
                                                          ConnectOptions connect) {
  connect.private_subchannels = true;
  return Connect(target, connect);
}

GemmClient LoadGenerator::MakeClient(const std::string& target, ConnectOptions connect) {
  connect.private_subchannels = true;
  return GemmClient(target, connect);
}

std::string LoadGenerator::PrepareRequests(Target kind, const GemmClient& client,
                                           std::vector<const v1::GemmRequest*>* requests,
                                           std::vector<std::unique_ptr<v1::GemmRequest>>* owned,
                                           std::vector<std::string>* uploaded, int* code) const {
  const Resident resident = options_.resident;
  requests->clear();
  if (resident == Resident::kNone) {
    for (const auto& p : payloads_) requests->push_back(&p->gemm);
    return "";
  }
  CallOptions call;
  call.client_id = options_.client_id;
  call.timeout = std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000));
  // A handle for one operand: uploaded (service), or a placeholder the echo never sends.
  auto handle = [&](const Shape& shape, const char* which, uint32_t rows, uint32_t cols,
                    const std::string& data, std::string* out) -> std::string {
    if (kind == Target::kEcho) {
      *out = "echo-placeholder";
      return "";
    }
    return Upload(client, shape, which, rows, cols, data, &call, uploaded, out, code);
  };
  for (const auto& p : payloads_) {
    const Shape& shape = p->shape;
    auto r = std::make_unique<v1::GemmRequest>();
    r->set_m(shape.m);
    r->set_n(shape.n);
    r->set_k(shape.k);
    r->set_transpose_a(p->gemm.transpose_a());
    r->set_transpose_b(p->gemm.transpose_b());
    r->set_dtype(p->gemm.dtype());
    r->set_c_dtype(p->gemm.c_dtype());
    *r->mutable_options() = p->gemm.options();
    const bool ta = options_.form.transpose_a, tb = options_.form.transpose_b;  // as stored:
    call.replica.clear();  // each shape's first upload is balanced
    std::string e;
    if (resident == Resident::kAll) {
      e = handle(shape, "A", ta ? shape.k : shape.m, ta ? shape.m : shape.k, p->gemm.a(),
                 r->mutable_a_handle());
      r->set_keep_c_resident(true);
    } else {
      r->set_a(p->gemm.a());
    }
    if (e.empty()) {
      e = handle(shape, "B", tb ? shape.n : shape.k, tb ? shape.k : shape.n, p->gemm.b(),
                 r->mutable_b_handle());
    }
    if (!e.empty()) return e;
    requests->push_back(r.get());
    owned->push_back(std::move(r));
  }
  return "";
}

std::string LoadGenerator::Upload(const GemmClient& client, const Shape& shape, const char* which,
                                  uint32_t rows, uint32_t cols, const std::string& data,
                                  CallOptions* call, std::vector<std::string>* uploaded,
                                  std::string* handle, int* code) const {
  v1::MatrixInfo info;
  const grpc::Status status =
      client.UploadMatrix(rows, cols, data, &info, /*ttl_seconds=*/0,
                          fmt::format("hgemm_load {} of {}", which, shape.Name()), *call,
                          options_.form.bf16 ? v1::DATA_TYPE_BF16 : v1::DATA_TYPE_UNSPECIFIED);
  if (!status.ok()) {
    *code = int(status.error_code());
    return fmt::format("UploadMatrix {} of {}: {} (code {})", which, shape.Name(),
                       status.error_message(), *code);
  }
  uploaded->push_back(info.handle());
  *handle = info.handle();
  call->replica = info.replica();
  return "";
}

void LoadGenerator::ReleaseUploads(const GemmClient& client,
                                   const std::vector<std::string>& handles) const {
  if (handles.empty()) return;
  CallOptions call;
  call.client_id = options_.client_id;
  call.timeout = std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000));
  for (const std::string& h : handles) client.ReleaseMatrix(h, call);  // best effort
}

std::string LoadGenerator::PrepareSharedRequests(
    const GemmClient& client, std::vector<const v1::GemmRequest*>* requests,
    std::vector<std::unique_ptr<v1::GemmRequest>>* owned, SharedOperands* shared,
    std::vector<std::string>* uploaded, int* code) const {
  requests->clear();
  const bool resident_b = options_.resident == Resident::kB;
  if (options_.mode != Mode::kUnary || (options_.resident != Resident::kNone && !resident_b)) {
    *code = int(grpc::StatusCode::INVALID_ARGUMENT);
    return "shared memory takes unary calls, with no resident operand or a resident B";
  }
  int64_t total = 0;
  for (const auto& p : payloads_) {
    total += SharedRegion::AlignPart(p->shape.ABytes());
    if (!resident_b) total += SharedRegion::AlignPart(p->shape.BBytes());
  }
  std::string error;
  shared->region = SharedRegion::Create(total, &error);
  if (!shared->region) {
    *code = int(grpc::StatusCode::INTERNAL);
    return "the operands' shared region: " + error;
  }
  CallOptions call;
  call.client_id = options_.client_id;
  call.timeout = std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000));
  int64_t at = 0;
  for (const auto& p : payloads_) {
    auto r = std::make_unique<v1::GemmRequest>(p->gemm);
    std::vector<std::pair<const std::string*, v1::RegionRef*>> in_region = {
        {&p->gemm.a(), r->mutable_a_region()}};  // clears a
    if (resident_b) {
      const Shape& shape = p->shape;
      const bool tb = options_.form.transpose_b;  // B as stored
      call.replica.clear();
      if (std::string e = Upload(client, shape, "B", tb ? shape.n : shape.k, tb ? shape.k : shape.n,
                                 p->gemm.b(), &call, uploaded, r->mutable_b_handle(), code);
          !e.empty()) {
        return e;
      }
    } else {
      in_region.push_back({&p->gemm.b(), r->mutable_b_region()});  // clears b
    }
    for (auto [operand, ref] : in_region) {
      std::memcpy(shared->region->data() + at, operand->data(), operand->size());
      ref->set_offset(uint64_t(at));
      at += SharedRegion::AlignPart(int64_t(operand->size()));
    }
    requests->push_back(r.get());
    owned->push_back(std::move(r));
  }
  call.replica.clear();
  v1::RegionInfo info;
  const grpc::Status status = client.RegisterRegion(shared->region->path(), shared->region->bytes(),
                                                    "hgemm_load A and B", &info, call);
  if (!status.ok()) {
    *code = int(status.error_code());
    return fmt::format("RegisterRegion: {} (code {})", status.error_message(), *code);
  }
  shared->handle = info.region();
  for (const auto& r : *owned) {
    r->mutable_a_region()->set_region(shared->handle);
    if (r->has_b_region()) r->mutable_b_region()->set_region(shared->handle);
  }
  return "";
}

void LoadGenerator::ReleaseShared(const GemmClient& client, SharedOperands* shared) const {
  if (shared->handle.empty()) return;
  CallOptions call;
  call.client_id = options_.client_id;
  call.timeout = std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000));
  client.UnregisterRegion(shared->handle, call);  // best effort (the server's TTL)
  shared->handle.clear();
}

VerifyResult LoadGenerator::Verify(const std::string& target, int per_shape, Transport transport) {
  VerifyResult result;
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000)) *
                            (per_shape * payloads_.size() + 1);
  const GemmClient client = MakeClient(target, options_.connect);
  std::vector<const v1::GemmRequest*> requests;
  std::vector<std::unique_ptr<v1::GemmRequest>> owned;
  std::vector<std::string> uploaded;
  int code = 0;
  SharedOperands shared;
  if (std::string e =
          transport != Transport::kGrpc
              ? PrepareSharedRequests(client, &requests, &owned, &shared, &uploaded, &code)
              : PrepareRequests(Target::kService, client, &requests, &owned, &uploaded, &code);
      !e.empty()) {
    ReleaseShared(client, &shared);
    ReleaseUploads(client, uploaded);
    result.checked = result.failed = 1;
    result.lines.push_back(e);
    return result;
  }
  CallOptions download_options;
  download_options.client_id = options_.client_id;
  download_options.timeout = std::chrono::milliseconds(int64_t(options_.call_timeout_s * 1000));
  std::string kept_c;
  std::unique_ptr<Caller> caller =
      load_internal::MakeCaller(Target::kService, options_, client, deadline, transport);
  std::mt19937_64 rng(options_.seed ^ 0x5eed);
  for (size_t shape_index = 0; shape_index < payloads_.size(); ++shape_index) {
    const auto& p = payloads_[shape_index];
    const Shape& shape = p->shape;
    for (int i = 0; i < per_shape; ++i) {
      ++result.checked;
      Sample s;
      caller->Call(*p, *requests[shape_index], &s);
      caller->Tidy();
      if (s.code != 0) {
        ++result.failed;
        result.lines.push_back(fmt::format("{}: call failed: {}", shape.Name(), caller->error()));
        continue;
      }
      std::string_view c_bytes = caller->reply();
      if (requests[shape_index]->keep_c_resident()) {
        // C stayed on the server: fetch it (as a chain's last step would).
        const grpc::Status status =
            client.DownloadMatrix(caller->kept_c(), &kept_c, download_options);
        if (!status.ok() || int64_t(kept_c.size()) != shape.ReplyBytes()) {
          ++result.failed;
          result.lines.push_back(fmt::format(
              "{}: DownloadMatrix of the kept C failed: {} (code {}), {} bytes", shape.Name(),
              status.error_message(), int(status.error_code()), kept_c.size()));
          continue;
        }
        c_bytes = kept_c;
      }
      int64_t rows = shape.m, row0 = 0;
      if (shape.Flops() / 2 > double(int64_t{1} << 27)) {
        rows = std::min<int64_t>(shape.m, 16);
        row0 = int64_t(rng() % uint64_t(shape.m - rows + 1));
      }
      const GemmForm& form = options_.form;
      const auto* a = reinterpret_cast<const uint16_t*>(p->gemm.a().data());
      const auto* b = reinterpret_cast<const uint16_t*>(p->gemm.b().data());
      // Rows row0.. of op(A), gathered untransposed (columns of a transposed A as stored).
      std::vector<uint16_t> a_rows(rows * shape.k);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t q = 0; q < shape.k; ++q) {
          a_rows[i * shape.k + q] =
              form.transpose_a ? a[q * shape.m + row0 + i] : a[(row0 + i) * shape.k + q];
        }
      }
      GemmForm rows_form = form;
      rows_form.transpose_a = false;
      const std::vector<float> reference =
          ReferenceGemm(a_rows.data(), b, rows, shape.n, shape.k, rows_form);
      const int64_t c_element = form.c_fp32 ? 4 : 2;
      const ErrorStats stats = CompareToReference(c_bytes.data() + row0 * shape.n * c_element,
                                                  reference.data(), rows * int64_t(shape.n), form);
      const double error = stats.nan_count > 0 ? INFINITY : stats.rel_frobenius;
      const v1::Execution& e = caller->execution();
      const double tolerance = ServiceTolerance(e.accumulation() == v1::ACCUMULATION_FP16, form);
      const bool ok = error <= tolerance;
      if (!ok) ++result.failed;
      result.max_error = std::max(result.max_error, error);
      result.lines.push_back(fmt::format(
          "{} rows {}..{}{}: kernel {} ({}) on {} [{}], relative error {:.2e} (tolerance {:.0e}): "
          "{}",
          shape.Name(), row0, row0 + rows - 1,
          transport != Transport::kGrpc
              ? fmt::format(" ({}{})",
                            options_.resident == Resident::kB ? "A, C in shared memory, B resident"
                                                              : "A, B, C in shared memory",
                            transport == Transport::kRing ? ", through a ring" : "")
          : options_.resident == Resident::kNone ? ""
          : options_.resident == Resident::kB    ? " (B resident)"
                                                 : " (A, B resident; kept C downloaded)",
          e.kernel(), e.accumulation() == v1::ACCUMULATION_FP16 ? "fp16" : "fp32",
          e.device_name().empty() ? "-" : e.device_name(), e.backend().empty() ? "-" : e.backend(),
          error, tolerance, ok ? "OK" : "FAILED"));
    }
  }
  caller.reset();  // releases its kept C
  ReleaseShared(client, &shared);
  ReleaseUploads(client, uploaded);
  return result;
}

PointResult LoadGenerator::RunPoint(Target kind, const std::string& target, int concurrency,
                                    double rate_per_s, Transport transport) {
  const LoadOptions& o = options_;
  PointResult result;
  result.target = kind;
  result.transport = transport;
  result.mode = o.mode;
  result.parallel_parts = o.parallel_parts;
  result.resident = o.resident;
  result.concurrency = concurrency;
  result.rate_per_s = rate_per_s;
  for (const Shape& shape : o.shapes) {
    result.shapes += (result.shapes.empty() ? "" : ",") + shape.Name() +
                     (o.shapes.size() > 1 ? fmt::format(":{}", shape.weight) : "");
  }

  const int per_channel = o.workers_per_channel <= 0 ? concurrency : o.workers_per_channel;
  std::vector<GemmClient> clients;  // one channel to the target each, and their replicas'
  for (int i = 0; i < (concurrency + per_channel - 1) / per_channel; ++i) {
    clients.push_back(MakeClient(target, kind == Target::kService ? o.connect : ConnectOptions{}));
  }
  std::vector<int> weights;
  for (const auto& p : payloads_) weights.push_back(p->shape.weight);

  // Resident operands: uploaded once per shape for all workers, before the warm-up.
  std::vector<const v1::GemmRequest*> requests;
  std::vector<std::unique_ptr<v1::GemmRequest>> owned;
  std::vector<std::string> uploaded;
  SharedOperands shared;
  {
    const Clock::time_point upload_start = Clock::now();
    int code = 0;
    std::string e =
        kind == Target::kService && transport != Transport::kGrpc
            ? PrepareSharedRequests(clients[0], &requests, &owned, &shared, &uploaded, &code)
            : PrepareRequests(kind, clients[0], &requests, &owned, &uploaded, &code);
    result.upload_s = Seconds(Clock::now() - upload_start);
    std::set<std::string> replicas;
    for (const std::string& handle : uploaded) {
      if (std::string replica = GemmClient::ReplicaOf(handle); !replica.empty())
        replicas.insert(replica);
    }
    result.upload_replicas.assign(replicas.begin(), replicas.end());
    if (!e.empty()) {
      ReleaseShared(clients[0], &shared);
      ReleaseUploads(clients[0], uploaded);
      result.first_error = e;
      result.error_codes[code] = 1;
      result.stats.push_back(Summarize({}, -1, 0, o.shapes, kind, o.resident));
      return result;
    }
  }

  const auto stream_deadline =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(int64_t((o.max_point_s + o.call_timeout_s) * 1000));
  const Clock::time_point start = Clock::now();
  const Clock::time_point hard_end =
      start + std::chrono::milliseconds(int64_t(o.max_point_s * 1000));
  Recorder recorder;
  std::atomic<bool> stop{false};
  std::atomic<int> warm_workers{0};
  std::atomic<int64_t> next_ticket{0};
  std::mutex stop_mu;
  std::condition_variable stop_cv;

  auto worker = [&](int index) {
    std::unique_ptr<Caller> caller = load_internal::MakeCaller(
        kind, o, clients[index / per_channel], stream_deadline, transport);
    std::mt19937_64 rng(o.seed + 7919 * (index + 1));
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    bool warm = false;
    while (!stop.load()) {
      Clock::time_point begin = Clock::now();
      if (rate_per_s > 0) {
        const int64_t ticket = next_ticket++;
        begin = start + std::chrono::nanoseconds(int64_t(ticket * 1e9 / rate_per_s));
        if (begin >= hard_end) break;
        std::unique_lock<std::mutex> lock(stop_mu);
        if (stop_cv.wait_until(lock, begin, [&] { return stop.load(); })) break;
      }
      Sample s;
      s.shape = pick(rng);
      caller->Call(*payloads_[s.shape], *requests[s.shape], &s);
      const Clock::time_point end = Clock::now();
      if (s.code == 0) s.batch_size = int(caller->execution().batch_size());
      s.end_s = Seconds(end - start);
      s.latency_ms = Seconds(end - begin) * 1e3;
      recorder.Add(s, caller->error());
      caller->Tidy();  // releases the previous kept C, outside the measured latency
      if (!warm) {
        warm = true;
        ++warm_workers;
      }
      // The server says "not now" (queue full): back off a little instead of spinning.
      if (s.code == int(grpc::StatusCode::UNAVAILABLE) ||
          s.code == int(grpc::StatusCode::RESOURCE_EXHAUSTED)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < concurrency; ++i) threads.emplace_back(worker, i);

  auto elapsed = [&] { return Seconds(Clock::now() - start); };
  const auto poll = std::chrono::milliseconds(5);
  // Warm-up: connections, streams, the server's per-shape kernel choice and buffers.
  while (elapsed() < o.max_point_s) {
    const bool all_warm = rate_per_s > 0 ? recorder.size() > 0 : warm_workers.load() >= concurrency;
    if (elapsed() >= o.warmup_s && all_warm) break;
    std::this_thread::sleep_for(poll);
  }
  result.warmup_requests = int64_t(recorder.size());

  // This process's CPU time (user + system, every thread): what the client costs per call.
  auto cpu_seconds = [] {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           1e-6 * double(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
  };
  struct Window {
    size_t begin = 0, end = 0;
    double t0 = 0, t1 = 0;
    double cpu0 = 0, cpu1 = 0;  // cpu_seconds()
    double requests_per_s = 0, p50_ms = 0;
    int64_t ok = 0;
  };
  std::vector<Window> windows;
  auto within = [&](auto get) {
    const size_t k = o.stable_windows;
    if (windows.size() < k) return false;
    double mean = 0;
    for (size_t i = windows.size() - k; i < windows.size(); ++i) mean += get(windows[i]) / k;
    for (size_t i = windows.size() - k; i < windows.size(); ++i) {
      if (windows[i].ok == 0 || std::abs(get(windows[i]) - mean) > o.stable_tolerance * mean)
        return false;
    }
    return mean > 0;
  };
  while (elapsed() < o.max_point_s) {
    Window w;
    w.begin = recorder.size();
    w.t0 = elapsed();
    w.cpu0 = cpu_seconds();
    while (elapsed() < o.max_point_s) {
      if (elapsed() - w.t0 >= o.window_s &&
          recorder.size() - w.begin >= size_t(o.min_window_requests)) {
        break;
      }
      std::this_thread::sleep_for(poll);
    }
    w.t1 = elapsed();
    w.cpu1 = cpu_seconds();
    w.end = recorder.size();
    std::vector<double> latencies;
    for (const Sample& s : recorder.Slice(w.begin, w.end)) {
      if (s.code == 0) latencies.push_back(s.latency_ms);
    }
    w.ok = int64_t(latencies.size());
    if (!latencies.empty()) {
      std::sort(latencies.begin(), latencies.end());
      w.p50_ms = Percentile(latencies, 50);
      w.requests_per_s = w.ok / std::max(w.t1 - w.t0, 1e-9);
    }
    windows.push_back(w);
    if (within([](const Window& x) { return x.requests_per_s; }) &&
        within([](const Window& x) { return x.p50_ms; })) {
      result.stable = true;
      break;
    }
    if (int(windows.size()) >= o.max_windows) break;
  }
  stop = true;
  {
    std::lock_guard<std::mutex> lock(stop_mu);
    stop_cv.notify_all();
  }
  for (std::thread& t : threads) t.join();  // the callers have released their kept Cs
  result.elapsed_s = elapsed();
  result.calls = int64_t(recorder.size());
  ReleaseShared(clients[0], &shared);
  ReleaseUploads(clients[0], uploaded);
  result.windows = int(windows.size());
  for (const Window& w : windows) result.window_requests_per_s.push_back(w.requests_per_s);
  result.first_error = recorder.first_error();
  for (const Sample& s : recorder.Slice(0, recorder.size())) {
    if (s.code != 0) ++result.error_codes[s.code];
  }

  // Statistics over the stable windows, or over all of them when it never settled.
  std::vector<Sample> measured;
  double seconds = 0;
  if (!windows.empty()) {
    const size_t first = result.stable ? windows.size() - o.stable_windows : 0;
    measured = recorder.Slice(windows[first].begin, windows.back().end);
    seconds = windows.back().t1 - windows[first].t0;
    result.client_cpu_s = windows.back().cpu1 - windows[first].cpu0;
  }
  result.stats.push_back(Summarize(measured, -1, seconds, o.shapes, kind, o.resident));
  if (o.shapes.size() > 1) {
    for (size_t i = 0; i < o.shapes.size(); ++i) {
      result.stats.push_back(Summarize(measured, int(i), seconds, o.shapes, kind, o.resident));
    }
  }
  return result;
}

}  // namespace hgemm::bench
