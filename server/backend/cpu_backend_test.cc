#include "server/backend/cpu_backend.h"

#include <gtest/gtest.h>

namespace hgemm {
namespace {

// Issue 12, item 11: a wrapped (negative) size used to be fetch_add-ed into the budget, which
// then stayed low for everyone.
TEST(CpuBackend, NonPositiveOrUnavailableSizesLeaveTheBudgetIntact) {
  std::unique_ptr<Backend> backend = MakeCpuBackend({.resident_budget_bytes = 1 << 20});
  std::shared_ptr<ResidentBuffer> buffer;
  for (int64_t bytes : {int64_t{0}, int64_t{-17179869182}, int64_t{1} << 21}) {
    EXPECT_FALSE(backend->AllocateResident(0, bytes, &buffer).ok()) << bytes;
    EXPECT_EQ(buffer, nullptr);
  }
  ASSERT_TRUE(backend->AllocateResident(0, 1 << 20, &buffer).ok());  // the whole budget is there
  EXPECT_EQ(buffer->bytes, 1 << 20);
}

}  // namespace
}  // namespace hgemm
