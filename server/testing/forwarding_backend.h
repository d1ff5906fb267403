// ForwardingBackend: a Backend passing everything to another; tests override what they change
// (a gate before Run, C handed over in pieces, failures). Test-only.
// Thread safety: that of the inner backend.
#ifndef HGEMM_SERVER_TESTING_FORWARDING_BACKEND_H_
#define HGEMM_SERVER_TESTING_FORWARDING_BACKEND_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/backend/backend.h"

namespace hgemm {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string Name() const override { return inner_->Name(); }
  std::vector<DeviceDescription> Devices() const override { return inner_->Devices(); }
  std::vector<KernelDescription> Kernels() const override { return inner_->Kernels(); }
  int NumSlots() const override { return inner_->NumSlots(); }
  int SlotDevice(int slot) const override { return inner_->SlotDevice(slot); }
  int64_t MaxJobBytes() const override { return inner_->MaxJobBytes(); }
  absl::Status AllocateResident(int device, int64_t bytes,
                                std::shared_ptr<ResidentBuffer>* buffer) override {
    return inner_->AllocateResident(device, bytes, buffer);
  }
  absl::Status WriteResident(ResidentBuffer& buffer, int64_t offset, const void* host,
                             int64_t bytes) override {
    return inner_->WriteResident(buffer, offset, host, bytes);
  }
  absl::Status ReadResident(const ResidentBuffer& buffer, void* host) override {
    return inner_->ReadResident(buffer, host);
  }
  absl::Status ReadResidentRange(const ResidentBuffer& buffer, int64_t offset, int64_t bytes,
                                 void* host) override {
    return inner_->ReadResidentRange(buffer, offset, bytes, host);
  }
  absl::Status PinHostMemory(void* data, int64_t bytes, std::function<void()>* unpin) override {
    return inner_->PinHostMemory(data, bytes, unpin);
  }
  absl::Status OpenIpcMemory(const std::string& ipc_handle, const std::string& device,
                             int64_t bytes, std::shared_ptr<ResidentBuffer>* buffer) override {
    return inner_->OpenIpcMemory(ipc_handle, device, bytes, buffer);
  }
  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    return inner_->Run(slot, job, report);
  }
  bool DeviceHealthy(int device_index) const override {
    return inner_->DeviceHealthy(device_index);
  }
  void TakeOutOfService(int device_index, const std::string& why) override {
    inner_->TakeOutOfService(device_index, why);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_FORWARDING_BACKEND_H_
