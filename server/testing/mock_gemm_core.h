// MockGemmCore: a GemmCoreInterface whose every method is a gMock mock, for testing the
// transport (GemmServiceImpl and its reactors) without a scheduler, store or backend: a test
// says what the core answers and checks what the transport makes of it. Methods without an
// expectation return gMock's default (an OK status, empty values); those returning a reference
// need an ON_CALL(...).WillByDefault(ReturnRef(...)) before the transport calls them. Its Admit
// can refuse but not admit: only GemmCore makes an AdmittedGemm.
// Test-only. Thread safety: gMock's (expectations are set before the calls that meet them).
#ifndef HGEMM_SERVER_TESTING_MOCK_GEMM_CORE_H_
#define HGEMM_SERVER_TESTING_MOCK_GEMM_CORE_H_

#include <gmock/gmock.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/session/gemm_core.h"

namespace hgemm {

class MockGemmCore : public GemmCoreInterface {
 public:
  MOCK_METHOD(const RequestRules&, rules, (), (const, override));
  MOCK_METHOD(absl::Status, Admit,
              (const std::string& owner, GemmOrder order, AdmittedGemm* admitted), (override));
  MOCK_METHOD(absl::Status, AllocateArriving,
              (int device_index, int64_t bytes, std::shared_ptr<ResidentBuffer>* buffer),
              (override));
  MOCK_METHOD(absl::Status, Run, (AdmittedGemm admitted, GemmFinished done), (override));

  MOCK_METHOD(std::string, BackendName, (), (const, override));
  MOCK_METHOD(std::vector<DeviceDescription>, Devices, (), (const, override));
  MOCK_METHOD(absl::Status, FindDevice,
              (int device_id, const std::string& field, int* device_index), (const, override));
  MOCK_METHOD(Scheduler::Stats, SchedulerStats, (), (const, override));

  MOCK_METHOD(int, DeviceId, (const ResidentMatrix& matrix), (const, override));
  MOCK_METHOD(const std::string&, replica, (), (const, override));
  MOCK_METHOD(absl::Status, CheckMatrixHeader,
              (const MatrixSpec& header, const std::string& field, int* device_index,
               ElementType* dtype),
              (const, override));
  MOCK_METHOD(absl::Status, ReserveMatrix,
              (const std::string& owner, int64_t bytes, QuotaReservation* quota), (override));
  MOCK_METHOD(absl::Status, AllocateMatrixBuffer,
              (int device_index, int64_t bytes, std::shared_ptr<ResidentBuffer>* buffer),
              (override));
  MOCK_METHOD(ResidentMatrix, AddMatrix,
              (QuotaReservation quota, const MatrixSpec& header, ElementType dtype,
               std::shared_ptr<ResidentBuffer> buffer),
              (override));
  MOCK_METHOD(void, CreateUpload,
              (const std::string& owner, const MatrixSpec& header, bool transient,
               UploadCreated done),
              (override));
  MOCK_METHOD(absl::Status, BeginPart,
              (const std::string& owner, const std::string& handle, int64_t offset, int64_t length,
               const std::string& field, std::shared_ptr<ResidentBuffer>* buffer),
              (override));
  MOCK_METHOD(absl::Status, EndPart,
              (const std::string& owner, const std::string& handle, int64_t offset, int64_t length,
               bool landed, int64_t* missing_bytes),
              (override));
  MOCK_METHOD(absl::Status, LookupMatrix,
              (const std::string& owner, const std::string& handle, const std::string& field,
               ResidentMatrix* matrix),
              (override));
  MOCK_METHOD(absl::Status, ReadMatrix,
              (const ResidentBuffer& buffer, int64_t offset, int64_t bytes, void* host),
              (override));
  MOCK_METHOD(absl::Status, ReleaseMatrix,
              (const std::string& owner, const std::string& handle, bool admin,
               int64_t* freed_bytes),
              (override));
  MOCK_METHOD(MatrixList, ListMatrices, (const std::string& owner, bool admin), (override));

  MOCK_METHOD(absl::Status, CheckRegionsAllowed, (bool over_unix_socket), (const, override));
  MOCK_METHOD(void, RegisterRegion,
              (const std::string& owner, bool over_unix_socket, const RegionSpec& spec,
               std::optional<RegisteringProcess> process, RegionRegistered done),
              (override));
  MOCK_METHOD(absl::Status, UnregisterRegion,
              (const std::string& owner, bool over_unix_socket, const std::string& handle,
               int64_t* freed_bytes),
              (override));
  MOCK_METHOD(absl::Status, ListRegions,
              (const std::string& owner, bool over_unix_socket, RegionList* list), (override));
  MOCK_METHOD(absl::Status, LeaseRegion,
              (const std::string& owner, bool over_unix_socket, const std::string& handle,
               uint64_t offset, int64_t bytes, const std::string& field, RegionLease* lease),
              (override));
  MOCK_METHOD(absl::Status, ReadRegion,
              (const std::string& owner, bool over_unix_socket, const std::string& handle,
               uint64_t offset, int64_t bytes, const std::string& field, WireBytes* data),
              (override));

  MOCK_METHOD(UploadQueue&, uploads, (), (override));
  MOCK_METHOD(HostBufferPool&, host_buffers, (), (override));
};

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_MOCK_GEMM_CORE_H_
