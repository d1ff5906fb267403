// Host-side IEEE binary16 (and bfloat16) <-> binary32 conversion of whole arrays.
//
// fp16 values travel as raw uint16_t bit patterns (the wire format of hgemm.v1). Conversion uses
// the x86 F16C instructions (round to nearest even), eight elements at a time.
// Thread safety: pure functions.
#ifndef HGEMM_PROTO_NUMERICS_FP16_H_
#define HGEMM_PROTO_NUMERICS_FP16_H_

#include <cstddef>
#include <cstdint>

namespace hgemm {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

// REQUIRES: `in` and `out` hold `count` elements and do not overlap.
void HalfToFloat(const uint16_t* in, float* out, size_t count);
void FloatToHalf(const float* in, uint16_t* out, size_t count);

// bfloat16 (the upper 16 bits of a binary32) <-> binary32; to bf16 rounds to nearest even and
// keeps NaNs NaN (quiet).
float Bf16ToFloat(uint16_t h);
uint16_t FloatToBf16(float f);
// REQUIRES: as above.
void Bf16ToFloat(const uint16_t* in, float* out, size_t count);
void FloatToBf16(const float* in, uint16_t* out, size_t count);

}  // namespace hgemm

#endif  // HGEMM_PROTO_NUMERICS_FP16_H_
