#include "client/completion_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace hgemm {
namespace {

// A call whose run waits until it is released or interrupted.
struct BlockingCall {
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<grpc::Status> reported;
  std::atomic<bool> interrupted{false};

  std::shared_ptr<QueuedCall> Make() {
    return std::make_shared<QueuedCall>(
        [this] {
          started.set_value();
          released.wait();
        },
        [this](const grpc::Status& s) { reported.set_value(s); },
        [this] {
          interrupted = true;
          release.set_value();
        });
  }
};

TEST(CompletionThreads, RunsEachCallThenReportsItOk) {
  CompletionThreads threads(2);
  std::vector<int> ran(5, 0);
  std::vector<std::promise<grpc::Status>> reported(5);
  for (int i = 0; i < 5; ++i) {
    threads.Add(std::make_shared<QueuedCall>([&ran, i] { ran[i] = 1; },
                                             [&ran, &reported, i](const grpc::Status& s) {
                                               EXPECT_EQ(ran[i], 1) << "done runs after run";
                                               reported[i].set_value(s);
                                             }));
  }
  for (auto& r : reported) EXPECT_TRUE(r.get_future().get().ok());
}

TEST(CompletionThreads, ACallCancelledBeforeItStartsIsReportedCancelledWithoutRunning) {
  CompletionThreads threads(1);
  BlockingCall first;
  threads.Add(first.Make());
  first.started.get_future().wait();  // the only thread is busy
  bool ran = false;
  std::promise<grpc::Status> reported;
  auto second = std::make_shared<QueuedCall>(
      [&ran] { ran = true; }, [&reported](const grpc::Status& s) { reported.set_value(s); });
  threads.Add(second);
  second->Cancel();
  first.release.set_value();
  const grpc::Status s = reported.get_future().get();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(s.error_message(), "the call was cancelled before it started");
  EXPECT_FALSE(ran);
  EXPECT_TRUE(first.reported.get_future().get().ok());
  EXPECT_FALSE(first.interrupted);
}

TEST(CompletionThreads, CancellingARunningCallInterruptsIt) {
  CompletionThreads threads(1);
  BlockingCall call;
  auto queued = call.Make();
  threads.Add(queued);
  call.started.get_future().wait();
  queued->Cancel();
  EXPECT_TRUE(call.reported.get_future().get().ok()) << "it ran: done says so";
  EXPECT_TRUE(call.interrupted);
  queued->Cancel();  // over: nothing to interrupt
}

TEST(CompletionThreads, StopInterruptsRunningCallsAndReportsQueuedOnesCancelled) {
  CompletionThreads threads(1);
  BlockingCall running;
  threads.Add(running.Make());
  running.started.get_future().wait();
  std::promise<grpc::Status> reported;
  threads.Add(std::make_shared<QueuedCall>(
      [] { ADD_FAILURE() << "a call queued when the threads stop never runs"; },
      [&reported](const grpc::Status& s) { reported.set_value(s); }));
  threads.Stop();
  EXPECT_TRUE(running.interrupted);
  EXPECT_TRUE(running.reported.get_future().get().ok());
  const grpc::Status s = reported.get_future().get();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(s.error_message(), "the client was destroyed before the call started");
  threads.Stop();  // a second Stop does nothing
}

TEST(CompletionThreads, NoMoreThanTheMaximumRunAtOnce) {
  constexpr int kMax = 3, kCalls = 12;
  CompletionThreads threads(kMax);
  std::atomic<int> now{0}, most{0};
  std::vector<std::promise<void>> reported(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    threads.Add(std::make_shared<QueuedCall>(
        [&] {
          const int n = ++now;
          int seen = most.load();
          while (n > seen && !most.compare_exchange_weak(seen, n)) {
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          --now;
        },
        [&reported, i](const grpc::Status&) { reported[i].set_value(); }));
  }
  for (auto& r : reported) r.get_future().wait();
  EXPECT_LE(most.load(), kMax);
  EXPECT_GE(most.load(), 1);
}

TEST(CompletionThreads, WhatACallHoldsIsFreedOnceItIsReported) {
  CompletionThreads threads(1);
  auto held = std::make_shared<int>(1);
  std::weak_ptr<int> watch = held;
  std::promise<void> reported;
  auto call = std::make_shared<QueuedCall>(
      [held] {}, [&reported](const grpc::Status&) { reported.set_value(); });
  held.reset();
  threads.Add(call);
  reported.get_future().wait();
  threads.Stop();  // the thread has left Finish
  EXPECT_TRUE(watch.expired()) << "the handle (call) still lives; its functions do not";
}

}  // namespace
}  // namespace hgemm
