#include "server/session/host_buffer_pool.h"

#include <gtest/gtest.h>

namespace hgemm {
namespace {

TEST(HostBufferPool, RecyclesABufferThatFits) {
  HostBufferPool pool(1 << 20);
  std::string first = pool.Take(100'000);
  EXPECT_EQ(first.size(), 100'000u);
  const char* address = first.data();
  pool.Give(std::move(first));
  EXPECT_GE(pool.idle_bytes(), 100'000);
  std::string second = pool.Take(90'000);  // fits (not over twice its size): the same memory
  EXPECT_EQ(second.size(), 90'000u);
  EXPECT_EQ(second.data(), address);
  EXPECT_EQ(pool.idle_bytes(), 0);
}

TEST(HostBufferPool, DoesNotHandOutFarLargerBuffers) {
  HostBufferPool pool(1 << 20);
  pool.Give(pool.Take(500'000));
  std::string small = pool.Take(1000);
  EXPECT_EQ(small.size(), 1000u);
  EXPECT_GE(pool.idle_bytes(), 500'000);  // still idle
}

TEST(HostBufferPool, KeepsNoMoreThanItsLimit) {
  HostBufferPool pool(150'000);
  pool.Give(pool.Take(100'000));
  pool.Give(pool.Take(100'000));  // takes the idle one back, then returns it
  std::string a = pool.Take(100'000), b = pool.Take(100'000);
  pool.Give(std::move(a));
  pool.Give(std::move(b));  // would pass 150'000: freed
  EXPECT_LE(pool.idle_bytes(), 150'000);
  EXPECT_GE(pool.idle_bytes(), 100'000);
}

}  // namespace
}  // namespace hgemm
