// What the decode-step kernels share: one exp (scalar and 8-wide, the same operations in
// the same order), bf16 <-> float conversions and rounding to the activation dtype
// (kernels/decode_ops.cpp, kernels/attention_ops.cpp).
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DRAFTSMAN_AVX2 1
#else
#define DRAFTSMAN_AVX2 0
#endif

namespace draftsman_simd {
// ---- exp: one polynomial, scalar and 8-wide, the same operations in the same order ----
//
// e^x = 2^n e^r with n = round(x log2 e), r = x - n ln 2 (two-part ln 2), e^r by a degree-6
// Taylor polynomial on |r| <= ln2 / 2 (relative error < 2e-7). Below -87.3 the result is 0
// (so a -inf bias masks exactly); above 88 it saturates at e^88.
constexpr float EXP_HI = 88.f;
constexpr float EXP_LO = -87.3f;
constexpr float LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693359375f;
constexpr float LN2_LO = -2.12194440e-4f;
constexpr float P[7] = {1.f, 1.f, 0.5f, 1.f / 6, 1.f / 24, 1.f / 120, 1.f / 720};

inline float exp_scalar(float x) {
  if (!(x >= EXP_LO)) return 0.f;  // also -inf and NaN-free masks
  x = std::fmin(x, EXP_HI);
  const float n = std::nearbyint(x * LOG2E);
  float r = std::fma(n, -LN2_HI, x);
  r = std::fma(n, -LN2_LO, r);
  float p = P[6];
  for (int i = 5; i >= 0; --i) p = std::fma(p, r, P[i]);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

#if DRAFTSMAN_AVX2
inline __m256 exp_avx2(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
  __m256 p = _mm256_set1_ps(P[6]);
  for (int i = 5; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P[i]));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  // bf16 -> f32 is the 16 bits moved to the top half of the word
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// float -> the nearest bf16 (ties to even), still as a float: what T(v) stores for T = bf16
// (NaN aside: never produced by these kernels from finite inputs)
inline __m256 round_bf16_avx2(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
  return _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(~0xffff)));
}

inline __m256 round_avx2(__m256 v, const float*) { return v; }
inline __m256 round_avx2(__m256 v, const c10::BFloat16*) { return round_bf16_avx2(v); }

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(c10::BFloat16* p, __m256 v) {
  // v holds bf16 values already (low 16 bits zero): keep the high halves
  const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// ---- the same operations 16 lanes wide (AVX-512): bit for bit the 8-wide results ----
#if DRAFTSMAN_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__)
#define DRAFTSMAN_AVX512_OPS 1
inline __m512 exp16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
  __m512 p = _mm512_set1_ps(P[6]);
  for (int i = 5; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P[i]));
  const __m512i bits = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(bits));
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m512 round16(__m512 v, const float*) { return v; }
inline __m512 round16(__m512 v, const c10::BFloat16*) {  // round_bf16_avx2, 16 lanes
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  return _mm512_castsi512_ps(_mm512_and_si512(up, _mm512_set1_epi32(~0xffff)));
}

// silu(g) * up for 16 lanes of gate and up values already in the activation dtype (as
// floats), rounded as silu_mul_span rounds them: the span's 16-lane step, for callers that
// hold gate and up in registers (the records kernel's SwiGLU epilogue)
template <typename T>
inline __m512 silu_mul16(__m512 g, __m512 up, const T* y) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  const __m512 silu = round16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), y);
  return round16(_mm512_mul_ps(silu, up), y);
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(c10::BFloat16* p, __m512 v) {  // v holds bf16 values already
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}
#else
#define DRAFTSMAN_AVX512_OPS 0
#endif

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }

// the value as the activation dtype stores it (bf16: rounded to nearest even)
template <typename T>
inline float round_to(float v) {
  return static_cast<float>(T(v));
}

// y = silu(gate) * up over n elements (a fused gate/up row's halves, or a records unit's 16
// columns: kernels/gguf_matmul_records.cpp), elementwise: any split of a row into spans
// whose lengths are multiples of 16 gives the same bits.
template <typename T>
inline void silu_mul_span(const T* gate, const T* up, int64_t n, T* y) {
  // silu(g) = g / (1 + e^-g), stored in the activation dtype, then times up (as PyTorch's
  // F.silu(gate).mul_(up) rounds); the same exp in both paths below
  int64_t i = 0;
#if DRAFTSMAN_AVX512_OPS
  for (; i + 16 <= n; i += 16) {  // the 8-wide path's operations, 16 lanes at a time
    store16(y + i, silu_mul16(load16(gate + i), load16(up + i), y));
  }
#endif
#if DRAFTSMAN_AVX2
  for (; i + 8 <= n; i += 8) {
    const __m256 g = load8(gate + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = round_avx2(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)), y);
    store8(y + i, round_avx2(_mm256_mul_ps(silu, load8(up + i)), y));
  }
#endif
  for (; i < n; ++i) {
    const float g = to_float(gate[i]);
    const float s = g / (1.f + exp_scalar(-g));
    y[i] = T(round_to<T>(s) * to_float(up[i]));
  }
}

}  // namespace draftsman_simd
