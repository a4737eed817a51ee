// y = x W^T where W is a GGUF matrix kept in its own K-quant blocks (Q4_K or Q6_K).
//
// Decoding reads every weight once per token, so the bytes per weight set the floor on
// latency: the blocks are read as the GGUF stores them (4.5 and 6.6 bits per weight), never
// unpacked in memory. Each row of x is first quantised to int8 per 256-wide block (one float
// scale d_x and 16 partial sums, like llama.cpp's Q8_K), so a block's dot product runs on
// integer multiply-adds (AVX2 maddubs: unsigned weight nibbles x signed activations).
//
// Invariant (batch invariance): y[m, n] depends on row m of x and row n of W only, computed
// in the same order whatever the number of rows M and however rows are split over threads.
// Exact decoding methods on this path therefore emit their own autoregressive tokens.
//
// Block layouts (256 weights each; f16 = IEEE half):
//   Q4_K (144 B): d f16, dmin f16, 12 B of packed 6-bit (scale, min) for 8 sub-blocks of 32,
//                 128 B of nibbles. w = d * sc_j * q - dmin * m_j, q in 0..15.
//                 Nibble bytes 32p..32p+31: low nibble -> sub-block 2p, high -> 2p+1.
//   Q6_K (210 B): 128 B low 4 bits, 64 B high 2 bits, 16 int8 scales, d f16.
//                 w = d * sc_i * (q - 32), q in 0..63, sub-block i = elements 16i..16i+15.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "check_message.h"

#include "kquant_blocks.h"

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define DRAFTSMAN_AVX2 1
#else
#define DRAFTSMAN_AVX2 0
#endif
// AVX-512 with VNNI (Ice Lake, Sapphire Rapids and later Xeons; Zen 4 and later EPYCs):
// 64 weights per instruction and the pair-sum, scale and accumulate fused (vpdpwssd)
#if DRAFTSMAN_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define DRAFTSMAN_AVX512 1
#else
#define DRAFTSMAN_AVX512 0
#endif

namespace {

using namespace draftsman_kquant;

constexpr int PREFETCH = 2048;  // bytes ahead in a thread's weight stream (measured: 1-4 KiB alike)
constexpr int64_t TILE_BYTES = 256 * 1024;  // quantised activation rows kept hot per tile

// ---- scalar reference (any CPU; the tests hold the SIMD path to it) ----

float dot_q4k_scalar(const uint8_t* w, const Q8Block* x, int64_t nb) {
  float sum = 0.f;
  for (int64_t b = 0; b < nb; ++b, w += Q4K_BYTES) {
    const float d = read_half(w) * x[b].d;
    const float dmin = read_half(w + 2) * x[b].d;
    const uint8_t* qs = w + 16;
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      q4k_scale_min(w + 4, j, &sc, &m);
      const uint8_t* bytes = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      int dot = 0;
      for (int l = 0; l < 32; ++l) dot += ((bytes[l] >> shift) & 15) * x[b].q[32 * j + l];
      isum += sc * dot;
      msum += m * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
    }
    sum += d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return sum;
}

float dot_q6k_scalar(const uint8_t* w, const Q8Block* x, int64_t nb) {
  float sum = 0.f;
  for (int64_t b = 0; b < nb; ++b, w += Q6K_BYTES) {
    for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH + 64 * l, _MM_HINT_T0);
    const int8_t* scales = reinterpret_cast<const int8_t*>(w + 192);
    int isum = 0;
    for (int i = 0; i < 16; ++i) {
      int dot = 0;
      for (int l = 0; l < 16; ++l) dot += q6k_value(w, 16 * i + l) * x[b].q[16 * i + l];
      isum += scales[i] * (dot - 32 * x[b].bsums[i]);
    }
    sum += read_half(w + 208) * x[b].d * static_cast<float>(isum);
  }
  return sum;
}

// ---- AVX2 ----

#if DRAFTSMAN_AVX2
float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float fast_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The 8 scales and 8 mins of a Q4_K block, unpacked from their 12 bytes four at a time
// (bytewise, the same rule as q4k_scale_min): out[0..7] scales, out[8..15] mins.
void q4k_unpack_scales(const uint8_t* s, uint8_t* out) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t six = 0x3f3f3f3fu, four = 0x0f0f0f0fu, two = 0x03030303u;
  const uint32_t words[4] = {a & six, (c & four) | (((a >> 6) & two) << 4), b & six,
                             ((c >> 4) & four) | (((b >> 6) & two) << 4)};
  std::memcpy(out, words, 16);
}

// Broadcast masks for _mm256_shuffle_epi8 on int16 lanes: mask `pick(a, b)` fills the low
// 128-bit lane with int16 element a of that lane and the high lane with element b of its own.
__m256i pick16(int a, int b) {
  return _mm256_setr_epi8(2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1,
                          2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1,
                          2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1,
                          2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1);
}

float hsum128(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// R rows of x against one weight row: the weights are unpacked once per block and reused.
// Per block and row: 8 maddubs (u8 nibbles x s8 activations -> s16) and 8 madd by the
// sub-block scale (-> s32); the mins term sum_j m_j * sum(x over sub-block j) is one madd,
// accumulated as floats across blocks and reduced once at the end.
template <int R>
void q4k_rows_avx2(const uint8_t* w, const Q8Block* x, int64_t nb, int64_t stride, float* out) {
  const __m256i low4 = _mm256_set1_epi8(15);
  __m256i pick[8];
  for (int j = 0; j < 8; ++j) pick[j] = pick16(j, j);
  __m256 acc[R];
  __m128 accm[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    accm[r] = _mm_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b, w += Q4K_BYTES) {
    _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH + 64, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH + 128, _MM_HINT_T0);
    alignas(16) uint8_t sm[16];
    q4k_unpack_scales(w + 4, sm);
    const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(sm)));
    const __m256i scales = _mm256_permute2x128_si256(sm16, sm16, 0x00);  // s0..s7 | s0..s7
    const __m128i mins16 = _mm256_extracti128_si256(sm16, 1);
    const float d = fast_half(w), dmin = fast_half(w + 2);
    __m256i q[8];
    for (int p = 0; p < 4; ++p) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * p));
      q[2 * p] = _mm256_and_si256(bytes, low4);
      q[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
    }
    // one row: each scale broadcast where it is used; several: once per block for all rows
    __m256i sc[R > 1 ? 8 : 1];
    if constexpr (R > 1) {
      for (int j = 0; j < 8; ++j) sc[j] = _mm256_shuffle_epi8(scales, pick[j]);
    }
    for (int r = 0; r < R; ++r) {
      const Q8Block& xb = x[r * stride + b];
      __m256i iacc = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q + 32 * j));
        const __m256i scale = R > 1 ? sc[j] : _mm256_shuffle_epi8(scales, pick[j]);
        // |maddubs| <= 2 * 15 * 127, x 6-bit scale pairs: far inside int32
        iacc = _mm256_add_epi32(iacc, _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], xv), scale));
      }
      const __m128i mp =
          _mm_madd_epi16(mins16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.psums)));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(iacc), acc[r]);
      accm[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * xb.d), _mm_cvtepi32_ps(mp), accm[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) - hsum128(accm[r]);
}

// Q6_K: weights 0..63 (the -32 is taken out through the 16-wide activation sums, folded into
// the same int32 accumulator), a signed 8-bit scale per 16 weights.
template <int R>
void q6k_rows_avx2(const uint8_t* w, const Q8Block* x, int64_t nb, int64_t stride, float* out) {
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i hi2 = _mm256_set1_epi8(0x30);
  // 32 elements j = sub-blocks 2j (low lane) and 2j + 1 (high lane)
  const __m256i pick[4] = {pick16(0, 1), pick16(2, 3), pick16(4, 5), pick16(6, 7)};
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += Q6K_BYTES) {
    for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH + 64 * l, _MM_HINT_T0);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192)));
    const __m256i sc_lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);  // s0..s7 twice
    const __m256i sc_hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);  // s8..s15 twice
    const float d = fast_half(w + 208);
    __m256i q[8], sc[8];
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = w + 64 * half;
      const uint8_t* qh = w + 128 + 32 * half;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
      __m256i* o = q + 4 * half;
      // high 2 bits of chunk c sit at bits 2c..2c+1 of h; moved to bits 4..5
      o[0] = _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), hi2));
      o[1] = _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), hi2));
      o[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(h, hi2));
      o[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low4),
                             _mm256_and_si256(_mm256_srli_epi16(h, 2), hi2));
    }
    for (int j = 0; j < 4; ++j) {
      sc[j] = _mm256_shuffle_epi8(sc_lo, pick[j]);
      sc[j + 4] = _mm256_shuffle_epi8(sc_hi, pick[j]);
    }
    for (int r = 0; r < R; ++r) {
      const Q8Block& xb = x[r * stride + b];
      // sum_i sc_i * bsums_i, for the -32 in (q - 32): per lane |.| <= 2 * 128 * 2032 * 32
      __m256i iacc = _mm256_slli_epi32(_mm256_madd_epi16(
          sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums))), 5);
      iacc = _mm256_sub_epi32(_mm256_setzero_si256(), iacc);
      for (int j = 0; j < 8; ++j) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q + 32 * j));
        // u8 (0..63) x s8 pairs -> s16 (|.| <= 2 * 63 * 127), x scale pairs -> s32
        iacc = _mm256_add_epi32(iacc, _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], xv), sc[j]));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(iacc), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}
#endif

// ---- AVX-512 VNNI ----
//
// The same integer sums as the AVX2 path, 64 weights at a time: one zmm holds two 32-wide
// Q4_K sub-blocks (or four 16-wide Q6_K ones), maddubs pairs u8 weights with s8 activations
// into s16, and vpdpwssd multiplies those by the sub-block scales and adds them to the int32
// accumulator in one instruction. A block's weights and scale vectors are unpacked once for
// up to 8 activation rows, which then cost 3 instructions per 64 weights each.

#if DRAFTSMAN_AVX512
float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

template <int R>
void q4k_rows_avx512(const uint8_t* w, const Q8Block* x, int64_t nb, int64_t stride, float* out) {
  const __m512i low4 = _mm512_set1_epi8(15);
  // int16 lane i of the scale vector for pair p: sub-block 2p (lanes 0..15), 2p+1 (16..31)
  __m512i pick[4];
  for (int p = 0; p < 4; ++p) {
    alignas(64) int16_t idx[32];
    for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(2 * p + i / 16);
    pick[p] = _mm512_load_si512(idx);
  }
  __m512 acc[R];
  __m128 accm[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    accm[r] = _mm_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b, w += Q4K_BYTES) {
    _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH + 64, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH + 128, _MM_HINT_T0);
    alignas(16) uint8_t sm[16];
    q4k_unpack_scales(w + 4, sm);
    const __m128i sm8 = _mm_load_si128(reinterpret_cast<const __m128i*>(sm));
    const __m512i scales = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(sm8));  // s0..s7 low
    const __m128i mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm8, 8));
    const float d = fast_half(w), dmin = fast_half(w + 2);
    __m512i q[4], sc[4];
    for (int p = 0; p < 4; ++p) {
      // 32 bytes -> elements 64p..64p+31 (low nibbles) then 64p+32..64p+63 (high)
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * p));
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(bytes),
                                              _mm256_srli_epi16(bytes, 4), 1);
      q[p] = _mm512_and_si512(both, low4);
      sc[p] = _mm512_permutexvar_epi16(pick[p], scales);
    }
    for (int r = 0; r < R; ++r) {
      const Q8Block& xb = x[r * stride + b];
      __m512i iacc = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {
        const __m512i xv = _mm512_loadu_si512(xb.q + 64 * p);
        iacc = _mm512_dpwssd_epi32(iacc, _mm512_maddubs_epi16(q[p], xv), sc[p]);
      }
      const __m128i mp =
          _mm_madd_epi16(mins16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.psums)));
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * xb.d), _mm512_cvtepi32_ps(iacc), acc[r]);
      accm[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * xb.d), _mm_cvtepi32_ps(mp), accm[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum512(acc[r]) - hsum128(accm[r]);
}

template <int R>
void q6k_rows_avx512(const uint8_t* w, const Q8Block* x, int64_t nb, int64_t stride, float* out) {
  const __m512i low4 = _mm512_set1_epi8(15);
  const __m512i hi2 = _mm512_set1_epi8(0x30);
  // int16 shift counts per 256-bit half: chunks (0, 1) take qh << 4 and << 2; (2, 3) >> 0, >> 2
  const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i down = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
  // scale vector v of a block: 16-wide sub-blocks 4v..4v+3, 8 int16 lanes each
  __m512i pick[4];
  for (int v = 0; v < 4; ++v) {
    alignas(64) int16_t idx[32];
    for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(4 * v + i / 8);
    pick[v] = _mm512_load_si512(idx);
  }
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += Q6K_BYTES) {
    for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH + 64 * l, _MM_HINT_T0);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192)));
    const __m512i sc512 = _mm512_castsi256_si512(sc16);
    const float d = fast_half(w + 208);
    __m512i q[4], sc[4];
    for (int half = 0; half < 2; ++half) {
      const __m512i ql = _mm512_loadu_si512(w + 64 * half);
      const __m512i h = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * half)));
      // elements 128 half + 0..63: chunks 0, 1 (low nibbles); 64..127: chunks 2, 3 (high)
      q[2 * half] = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                    _mm512_and_si512(_mm512_sllv_epi16(h, up), hi2));
      q[2 * half + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                        _mm512_and_si512(_mm512_srlv_epi16(h, down), hi2));
    }
    for (int v = 0; v < 4; ++v) sc[v] = _mm512_permutexvar_epi16(pick[v], sc512);
    for (int r = 0; r < R; ++r) {
      const Q8Block& xb = x[r * stride + b];
      // the -32 of (q - 32): sum_i sc_i * bsums_i, as in the AVX2 path
      const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(
          sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums))), 5);
      __m512i iacc = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(off));
      for (int v = 0; v < 4; ++v) {
        const __m512i xv = _mm512_loadu_si512(xb.q + 64 * v);
        iacc = _mm512_dpwssd_epi32(iacc, _mm512_maddubs_epi16(q[v], xv), sc[v]);
      }
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * xb.d), _mm512_cvtepi32_ps(iacc), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum512(acc[r]);
}
#endif

// out[r] = dot(weight row w, x row r) for r < R; x rows are `stride` blocks apart.
using RowsFn = void (*)(const uint8_t*, const Q8Block*, int64_t, int64_t, float*);

template <float (*Dot)(const uint8_t*, const Q8Block*, int64_t), int R>
void rows_scalar(const uint8_t* w, const Q8Block* x, int64_t nb, int64_t stride, float* out) {
  for (int r = 0; r < R; ++r) out[r] = Dot(w, x + r * stride, nb);
}

// Kernels for 1..G rows at a time (G = `group`: 8 on AVX-512, 4 elsewhere); a batch of M rows
// runs as G-row groups and a remainder, each row's arithmetic being the same in every group.
constexpr int MAX_GROUP = 8;
struct Kernels {
  RowsFn rows[MAX_GROUP + 1];
  int group;
  const char* isa;
};

template <template <int> class F>
Kernels rows_up_to(int group, const char* isa) {
  Kernels k{{nullptr, F<1>::run, F<2>::run, F<3>::run, F<4>::run, F<5>::run, F<6>::run,
             F<7>::run, F<8>::run}, group, isa};
  for (int r = group + 1; r <= MAX_GROUP; ++r) k.rows[r] = nullptr;
  return k;
}

#define DRAFTSMAN_ROWS(name, fn) \
  template <int R>               \
  struct name {                  \
    static constexpr RowsFn run = fn; \
  };
DRAFTSMAN_ROWS(Q4Scalar, (rows_scalar<dot_q4k_scalar, R>))
DRAFTSMAN_ROWS(Q6Scalar, (rows_scalar<dot_q6k_scalar, R>))
#if DRAFTSMAN_AVX2
DRAFTSMAN_ROWS(Q4Avx2, q4k_rows_avx2<(R <= 4 ? R : 4)>)
DRAFTSMAN_ROWS(Q6Avx2, q6k_rows_avx2<(R <= 4 ? R : 4)>)
#endif
#if DRAFTSMAN_AVX512
DRAFTSMAN_ROWS(Q4Avx512, q4k_rows_avx512<R>)
DRAFTSMAN_ROWS(Q6Avx512, q6k_rows_avx512<R>)
#endif
#undef DRAFTSMAN_ROWS

// The widest path this build has, up to `simd` (0 scalar, 1 AVX2, 2 AVX-512 VNNI).
Kernels pick(int64_t qtype, int64_t simd) {
  const bool q4 = qtype == TYPE_Q4_K;
#if DRAFTSMAN_AVX512
  if (simd >= 2) return q4 ? rows_up_to<Q4Avx512>(8, "avx512vnni") : rows_up_to<Q6Avx512>(8, "avx512vnni");
#endif
#if DRAFTSMAN_AVX2
  if (simd >= 1) return q4 ? rows_up_to<Q4Avx2>(4, "avx2") : rows_up_to<Q6Avx2>(4, "avx2");
#endif
  (void)simd;
  return q4 ? rows_up_to<Q4Scalar>(4, "scalar") : rows_up_to<Q6Scalar>(4, "scalar");
}

at::Tensor kquant_mm(const at::Tensor& x, const at::Tensor& w, int64_t qtype, int64_t simd) {
  TORCH_CHECK(qtype == TYPE_Q4_K || qtype == TYPE_Q6_K, "kquant_mm: qtype must be Q4_K or Q6_K");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(x.dim() == 2 && (bf16 || x.scalar_type() == at::kFloat) && x.is_contiguous(),
              "kquant_mm: x must be a contiguous float32 or bfloat16 [M, K] tensor");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(),
              "kquant_mm: w must be a contiguous uint8 [N, bytes] tensor");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  // K from the weights: x may be narrower than their 256-multiple width (zero-padded weights)
  const int64_t block_bytes = qtype == TYPE_Q4_K ? Q4K_BYTES : Q6K_BYTES;
  const int64_t nb = w.size(1) / block_bytes, row_bytes = w.size(1);
  TORCH_CHECK(row_bytes == nb * block_bytes && k <= nb * QK && k > (nb - 1) * QK,
              draftsman_msg::text("kquant_mm: w rows hold ", w.size(1), " bytes, not whole blocks covering K = ", k));
  const std::vector<Q8Block> xq = quantize_rows(x, nb);
  // results in x's dtype (bf16: rounded to nearest even once, from the float32 sum)
  at::Tensor y = at::empty({m, n}, x.options());
  float* yf = bf16 ? nullptr : y.data_ptr<float>();
  c10::BFloat16* yb = bf16 ? y.data_ptr<c10::BFloat16>() : nullptr;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const Kernels kernels = pick(qtype, simd);
  // Rows of x in tiles of ~256 KiB of quantised blocks (a multiple of 4 rows), each tile
  // against every weight row: a long prefill's activations then stay in L2 while a weight
  // row streams past them, instead of coming from L3 once per weight row. Within a tile each
  // output column is one thread's work. Neither split changes a value.
  const int64_t g = kernels.group;
  const int64_t tile = std::max<int64_t>(g, (TILE_BYTES / (nb * int64_t(sizeof(Q8Block)))) / g * g);
  for (int64_t t0 = 0; t0 < m; t0 += tile) {
    const int64_t t1 = std::min(m, t0 + tile);
    at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
      float out[MAX_GROUP];
      for (int64_t j = begin; j < end; ++j) {
        const uint8_t* row = wp + j * row_bytes;
        for (int64_t r0 = t0; r0 < t1; r0 += g) {
          const int rows = static_cast<int>(std::min<int64_t>(g, t1 - r0));
          kernels.rows[rows](row, xq.data() + r0 * nb, nb, nb, out);
          for (int r = 0; r < rows; ++r) {
            if (bf16) {
              yb[(r0 + r) * n + j] = c10::BFloat16(out[r]);
            } else {
              yf[(r0 + r) * n + j] = out[r];
            }
          }
        }
      }
    });
  }
  return y;
}

// x [M, K] (float32 or bfloat16) as the kernels quantise it: each row's nb blocks of 256
// (zero-padded past K), every field of each Q8Block as bytes [M, nb, Q8_FIELD_BYTES] (the
// struct's padding left out), for tests of the quantisation itself.
constexpr int64_t Q8_FIELD_BYTES = offsetof(Q8Block, i8_offsets) + sizeof(Q8Block::i8_offsets);

at::Tensor q8_activation_blocks(const at::Tensor& x, int64_t nb) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "q8_activation_blocks: x must be a contiguous float32 or bfloat16 [M, K] tensor");
  TORCH_CHECK(nb > 0 && x.size(1) <= nb * QK, "q8_activation_blocks: nb blocks of 256 must cover K");
  const std::vector<Q8Block> xq = quantize_rows(x, nb);
  at::Tensor out = at::empty({x.size(0), nb, Q8_FIELD_BYTES}, x.options().dtype(at::kByte));
  for (int64_t i = 0; i < x.size(0) * nb; ++i) {
    std::memcpy(out.data_ptr<uint8_t>() + i * Q8_FIELD_BYTES, &xq[static_cast<size_t>(i)], Q8_FIELD_BYTES);
  }
  return out;
}

bool has_simd() { return DRAFTSMAN_AVX2 != 0; }

}  // namespace

TORCH_LIBRARY(draftsman, m) {
  // simd: the widest path allowed (0 scalar, 1 AVX2, 2 AVX-512 VNNI); the build's widest
  // at or below it runs
  m.def("kquant_mm(Tensor x, Tensor w, int qtype, int simd=2) -> Tensor");
  m.def("q8_activation_blocks(Tensor x, int nb) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftsman, CPU, m) {
  m.impl("kquant_mm", &kquant_mm);
  m.impl("q8_activation_blocks", &q8_activation_blocks);
}

extern "C" int draftsman_kquant_simd() { return has_simd() ? 1 : 0; }

// The path kquant_mm takes at its default: "avx512vnni", "avx2" or "scalar".
extern "C" const char* draftsman_kquant_isa() { return pick(TYPE_Q4_K, 2).isa; }
