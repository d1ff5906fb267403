#include "server/backend/device_memory.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace hgemm {
namespace {

constexpr int64_t kClass = DeviceMemory::kResidentGranularity;

// Host memory standing in for a device's, with a count of what is live. Can be made to fail.
class FakeAllocator final : public DeviceAllocator {
 public:
  ~FakeAllocator() override { EXPECT_TRUE(live_.empty()) << live_.size() << " buffers leaked"; }
  void* Allocate(int64_t bytes, std::string* error) override {
    if (fail_) {
      *error = "no memory";
      return nullptr;
    }
    allocations++;
    void* data = new char[bytes];
    live_.insert(data);
    return data;
  }
  void Free(void* data) override {
    EXPECT_EQ(live_.erase(data), 1u) << "freed twice or never allocated";
    delete[] static_cast<char*>(data);
  }
  size_t live() const { return live_.size(); }

  int allocations = 0;
  bool fail_ = false;

 private:
  std::set<void*> live_;
};

class DeviceMemoryTest : public ::testing::Test {
 protected:
  FakeAllocator allocator_;  // before the memory: it frees its cache through it
  DeviceMemory memory_{/*device_index=*/1, /*ordinal=*/7, /*budget_bytes=*/3 * kClass, &allocator_};
};

TEST_F(DeviceMemoryTest, ChargesWholeSizeClassesAndKeepsTheAskedBytes) {
  std::shared_ptr<ResidentBuffer> buffer;
  ASSERT_TRUE(memory_.AllocateResident(kClass + 1, &buffer).ok());
  EXPECT_EQ(buffer->bytes, kClass + 1);
  EXPECT_EQ(buffer->device_index, 1);
  EXPECT_EQ(memory_.used_bytes(), 2 * kClass);
}

// Small buffers take powers of two, not a 2 MiB page each (the H100 soak's leftover 48x48
// uploads: 4.6 KB each, 2 MiB of budget each before).
TEST_F(DeviceMemoryTest, SmallBuffersTakePowersOfTwoLargeOnesWholePages) {
  constexpr int64_t kSmall = DeviceMemory::kSmallestClass;
  EXPECT_EQ(DeviceMemory::SizeClass(1), kSmall);
  EXPECT_EQ(DeviceMemory::SizeClass(kSmall), kSmall);
  EXPECT_EQ(DeviceMemory::SizeClass(kSmall + 1), 2 * kSmall);
  EXPECT_EQ(DeviceMemory::SizeClass(48 * 48 * 2), 2 * kSmall);
  EXPECT_EQ(DeviceMemory::SizeClass((int64_t{1} << 20) + 1), kClass);
  EXPECT_EQ(DeviceMemory::SizeClass(kClass - 1), kClass);
  EXPECT_EQ(DeviceMemory::SizeClass(kClass), kClass);
  EXPECT_EQ(DeviceMemory::SizeClass(kClass + 1), 2 * kClass);
  EXPECT_EQ(DeviceMemory::SizeClass(int64_t{48} << 30), int64_t{48} << 30);
  std::vector<std::shared_ptr<ResidentBuffer>> tiny(100);
  for (auto& buffer : tiny) ASSERT_TRUE(memory_.AllocateResident(48 * 48 * 2, &buffer).ok());
  EXPECT_EQ(memory_.used_bytes(), 100 * 2 * kSmall);
  tiny.clear();  // cached by their class, and reused by it
  ASSERT_EQ(memory_.cached_bytes(), 100 * 2 * kSmall);
  std::shared_ptr<ResidentBuffer> again;
  ASSERT_TRUE(memory_.AllocateResident(5000, &again).ok());
  EXPECT_EQ(allocator_.allocations, 100);
  EXPECT_EQ(memory_.used_bytes(), 100 * 2 * kSmall);
}

TEST_F(DeviceMemoryTest, AFreedBufferIsReusedForItsSizeClassAndStaysCounted) {
  std::shared_ptr<ResidentBuffer> buffer;
  ASSERT_TRUE(memory_.AllocateResident(kClass - 100, &buffer).ok());
  void* data = buffer->data;
  buffer.reset();
  EXPECT_EQ(memory_.cached_bytes(), kClass);
  EXPECT_EQ(memory_.used_bytes(), kClass);
  ASSERT_TRUE(memory_.AllocateResident(kClass, &buffer).ok());  // same class
  EXPECT_EQ(buffer->data, data);
  EXPECT_EQ(allocator_.allocations, 1);
  EXPECT_EQ(memory_.cached_bytes(), 0);
}

TEST_F(DeviceMemoryTest, RefusesPastTheBudgetAfterFreeingTheCache) {
  std::shared_ptr<ResidentBuffer> small, big, refused;
  ASSERT_TRUE(memory_.AllocateResident(kClass, &small).ok());
  ASSERT_TRUE(memory_.AllocateResident(2 * kClass, &big).ok());
  const absl::Status s = memory_.AllocateResident(1, &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("device 7"), std::string::npos) << s;
  // A cached buffer of another class is returned to the driver when the budget needs it.
  big.reset();
  EXPECT_EQ(allocator_.live(), 2u);
  ASSERT_TRUE(memory_.AllocateResident(1, &big).ok());  // the smallest class: not the cached 2
  EXPECT_EQ(allocator_.allocations, 3);
  EXPECT_EQ(memory_.cached_bytes(), 0);
  EXPECT_EQ(memory_.used_bytes(), kClass + DeviceMemory::kSmallestClass);
}

TEST_F(DeviceMemoryTest, ReserveEmptiesTheCacheOnlyWhenItMustAndUnreserveGivesBack) {
  std::shared_ptr<ResidentBuffer> buffer;
  ASSERT_TRUE(memory_.AllocateResident(kClass, &buffer).ok());
  buffer.reset();
  ASSERT_TRUE(memory_.Reserve(2 * kClass));  // fits beside the cached class
  EXPECT_EQ(memory_.cached_bytes(), kClass);
  ASSERT_TRUE(memory_.Reserve(kClass));  // only by freeing it
  EXPECT_EQ(memory_.cached_bytes(), 0);
  EXPECT_EQ(allocator_.live(), 0u);
  EXPECT_FALSE(memory_.Reserve(1));
  EXPECT_EQ(memory_.used_bytes(), 3 * kClass);  // a refused claim takes nothing
  memory_.Unreserve(3 * kClass);
  EXPECT_EQ(memory_.used_bytes(), 0);
}

TEST_F(DeviceMemoryTest, AFailedAllocationTakesNothingFromTheBudget) {
  allocator_.fail_ = true;
  std::shared_ptr<ResidentBuffer> buffer;
  const absl::Status s = memory_.AllocateResident(1, &buffer);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("no memory"), std::string::npos) << s;
  EXPECT_EQ(memory_.used_bytes(), 0);
  EXPECT_EQ(memory_.AllocateResident(0, &buffer).code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace hgemm
