#include "kernels/testing.h"

#include "kernels/fill.h"
#include "proto/numerics/error_stats.h"

namespace hgemm::kernels::testing {

bool HaveGpu(int* cc) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
  *cc = prop.major * 10 + prop.minor;
  return true;
}

uint64_t NextSeed() {
  static uint64_t seed = 0x5eed;
  return ++seed;
}

cudaError_t FillRandom(void* data, size_t count, DataType type, cudaStream_t stream) {
  switch (type) {
    case DataType::kBf16:
      return FillUniform(static_cast<__nv_bfloat16*>(data), count, NextSeed(), -1.f, 1.f, stream);
    case DataType::kFp32:
      return FillUniform(static_cast<float*>(data), count, NextSeed(), -1.f, 1.f, stream);
    case DataType::kFp16:
      break;
  }
  return FillUniform(static_cast<__half*>(data), count, NextSeed(), -1.f, 1.f, stream);
}

uint16_t PoisonBits(DataType type) { return type == DataType::kFp16 ? 0x7E00 : 0x7FC0; }

cudaError_t Poison(void* c, size_t bytes, DataType type, cudaStream_t stream) {
  return FillBits(static_cast<__half*>(c), bytes / 2, PoisonBits(type), stream);
}

double ToleranceFor(DataType c_type, Accumulation acc) {
  if (c_type == DataType::kBf16) return kKernelToleranceBf16;
  if (c_type == DataType::kFp32) return kKernelTolerance.fp32_acc;
  return kKernelTolerance.For(acc == Accumulation::kFp16);
}

std::string TypesTestName(DataType ab, DataType c) {
  std::string types = TypesName(ab, c);
  if (auto arrow = types.find("→"); arrow != std::string::npos) types.replace(arrow, 3, "_to_");
  return types;
}

}  // namespace hgemm::kernels::testing
