// What the K-quant kernels share: the GGUF block constants and the int8 activation blocks
// every path multiplies against (kernels/gguf_matmul.cpp, kernels/gguf_matmul_records.cpp).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "simd_math.h"  // load16 (floats or bf16 as 16 floats), DRAFTSMAN_AVX512_OPS

namespace draftsman_kquant {

constexpr int QK = 256;  // weights per super-block
constexpr int Q4K_BYTES = 144;
constexpr int Q6K_BYTES = 210;
constexpr int Q8_0_BYTES = 34;  // f16 d, 32 int8 q: w = d q
constexpr int64_t TYPE_Q8_0 = 8;  // GGML type numbers
constexpr int64_t TYPE_Q4_K = 12;
constexpr int64_t TYPE_Q6_K = 14;

// One 256-wide block of an activation row quantised to int8: x ~= d * q.
// The quants come first in a 64-byte aligned record (320 bytes): every 64-byte piece of q is
// one cache line, so an AMX tile row (64 bytes of one row's block) is one aligned load; with
// `d` first, each was split over two lines (8960x1536 Q4_K, 128 rows: the kernel's A tile
// loads were a quarter of its time).
struct alignas(64) Q8Block {
  int8_t q[QK];
  float d;
  int16_t bsums[QK / 16];  // sums of q over each 16 elements
  int16_t psums[QK / 32];  // sums of q over each 32 elements
  // -32 bsums as int32: a Q6_K record's sums over a sub-block start here (C_j - 32 bsum_j
  // with the offset in the accumulator's first value, a broadcast load instead of a
  // broadcast, a subtraction and a register per row and sub-block)
  int32_t q6_offsets[QK / 16];
  // -128 psums as int32, for Q8_0 records, whose weights are stored as q + 128 (vpdpbusd
  // multiplies unsigned by signed bytes): their sums over a sub-block start here
  int32_t q8_offsets[QK / 32];
  // -128 times the sums of q over the even and the odd 32-wide sub-blocks, for int8-row
  // records (one accumulator per row over a whole record, its two halves as two)
  int32_t i8_offsets[2];
};

inline float half_to_float(uint16_t h) {
  // IEEE binary16 -> binary32, subnormals included
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float read_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// The sums of 32 and the offsets for weights stored as q + 128, from the sums of 16.
inline void int_offsets(Q8Block& o) {
  o.i8_offsets[0] = o.i8_offsets[1] = 0;
  for (int s = 0; s < QK / 32; ++s) {
    o.psums[s] = static_cast<int16_t>(o.bsums[2 * s] + o.bsums[2 * s + 1]);
    o.q8_offsets[s] = -128 * o.psums[s];
    o.i8_offsets[s % 2] += o.q8_offsets[s];
  }
}

// q = round-half-even(x * (127 / max|x|)) per 256, d = max|x| / 127 (the scalar loop states
// the rule; the AVX2 one computes the same values: max is exact, one float product each,
// and cvtps rounds half to even like nearbyint in the default mode).
inline void quantize_block_scalar(const float* xb, Q8Block& o) {
  float amax = 0.f;
  for (int i = 0; i < QK; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
  o.d = amax / 127.f;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  for (int i = 0; i < QK; ++i) {
    o.q[i] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
  }
  for (int s = 0; s < QK / 16; ++s) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += o.q[16 * s + i];
    o.bsums[s] = static_cast<int16_t>(sum);
  }
}

#if defined(__AVX2__)
inline void quantize_block_avx2(const float* xb, Q8Block& o) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 vmax = _mm256_setzero_ps();
  for (int i = 0; i < QK; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float amax = _mm_cvtss_f32(m);
  o.d = amax / 127.f;
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  for (int s = 0; s < QK / 16; ++s) {
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16 * s), inv));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16 * s + 8), inv));
    // int32 -> int16 -> int8 in element order (packs interleaves 128-bit lanes)
    const __m256i ab = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o.q + 16 * s),
                     _mm_packs_epi16(_mm256_castsi256_si128(ab), _mm256_extracti128_si256(ab, 1)));
    __m256i sum = _mm256_add_epi32(a, b);
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    o.bsums[s] = static_cast<int16_t>(_mm_cvtsi128_si32(h));
  }
}
#endif

#if DRAFTSMAN_AVX512_OPS
// The 16 lane sums of 16 vectors, in their order: a transposing tree (45 operations where
// 16 reductions take ~10 each).
inline __m512i sums_of_16(const __m512i* q) {
  __m512i w[4];
  for (int k = 0; k < 4; ++k) {  // 128-bit lane L of w[k]: (q[4k + i] over lane L, i < 4)
    const __m512i* a = q + 4 * k;
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
    w[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
  }
  __m512i v[2];
  for (int h = 0; h < 2; ++h) {  // lanes (w[2h] L0+L1, w[2h] L2+L3, w[2h+1] L0+L1, w[2h+1] L2+L3)
    v[h] = _mm512_add_epi32(_mm512_shuffle_i32x4(w[2 * h], w[2 * h + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(w[2 * h], w[2 * h + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// The sums every path reads, from a block's 16 sums of 16 (int32, in order; |sum| <= 16 *
// 127): bsums and the Q6_K offsets, then int_offsets' values (the sums of 32, the Q8_0
// offsets, the int8-row offsets over the even and the odd sub-blocks) from registers rather
// than its scalar loop (~12 ns of a block's ~60 here).
inline void store_sums(__m512i sums, Q8Block& o) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.bsums), _mm512_cvtepi32_epi16(sums));
  _mm512_storeu_si512(o.q6_offsets, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, 5)));
  // sum s of 32: lanes 2s + (2s + 1), each even lane's 64 bits narrowed to its low 32
  const __m256i psums = _mm512_cvtepi64_epi32(_mm512_add_epi32(sums, _mm512_srli_epi64(sums, 32)));
  // (narrowed 16 lanes wide, AVX-512F, the upper 8 unused: no AVX-512VL needed)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o.psums),
                   _mm256_castsi256_si128(_mm512_cvtepi32_epi16(_mm512_castsi256_si512(psums))));
  const __m256i offsets = _mm256_mullo_epi32(psums, _mm256_set1_epi32(-128));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q8_offsets), offsets);
  __m128i four = _mm_add_epi32(_mm256_castsi256_si128(offsets), _mm256_extracti128_si256(offsets, 1));
  four = _mm_add_epi32(four, _mm_unpackhi_epi64(four, four));  // (even, odd, ., .)
  o.i8_offsets[0] = _mm_cvtsi128_si32(four);
  o.i8_offsets[1] = _mm_extract_epi32(four, 1);
}

// The same values as quantize_block_scalar, 16 at a time, from floats, the block's 256 values
// and their q held in registers, the maxima and the 16 sums of 16 q as trees, not chains or
// a reduction each.
inline void quantize_block_avx512(const float* xb, Q8Block& o) {
  __m512 v[QK / 16], top[QK / 16];
  for (int s = 0; s < QK / 16; ++s) top[s] = _mm512_abs_ps(v[s] = _mm512_loadu_ps(xb + 16 * s));
  for (int w = QK / 32; w >= 1; w /= 2) {  // a tree, not a chain of 16 dependent maxima
    for (int s = 0; s < w; ++s) top[s] = _mm512_max_ps(top[s], top[s + w]);
  }
  const float amax = _mm512_reduce_max_ps(top[0]);
  o.d = amax / 127.f;
  const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m512i q[QK / 16];
  for (int s = 0; s < QK / 16; ++s) {
    q[s] = _mm512_cvtps_epi32(_mm512_mul_ps(v[s], inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o.q + 16 * s), _mm512_cvtsepi32_epi8(q[s]));
  }
  store_sums(sums_of_16(q), o);
}

// The same values straight from bf16, each 64-byte load of 32 taken apart into its even and
// its odd elements as floats (a shift, a mask) instead of widened 16 at a time: the shuffle
// port's widenings and narrowings (vpmovzxwd, vpmovsdb: ~48 of a block's ~80 shuffle
// operations on an AMX Xeon) become a blend and a pack per 32. The products, roundings and
// maxima are the float path's, element by element; the q go back in order (even and odd
// words interleaved, packed to bytes, the 128-bit lanes' quarters put back), and the sums of
// 16 come from the pair sums q[2i] + q[2i + 1]. One block 59.6 -> 33.4 ns on the AMX Xeon
// (bench-results/amx-glue; ~75 ns in a forward, which reads what the other core wrote), the
// same bytes.
inline void quantize_block_avx512(const c10::BFloat16* xb, Q8Block& o) {
  constexpr int C = QK / 32;  // 8 pieces of 32
  __m512 even[C], odd[C], top[C];
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int c = 0; c < C; ++c) {
    const __m512i raw = _mm512_loadu_si512(xb + 32 * c);
    even[c] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));  // elements 32c + 2i
    odd[c] = _mm512_castsi512_ps(_mm512_and_si512(raw, high));   // elements 32c + 2i + 1
    top[c] = _mm512_max_ps(_mm512_abs_ps(even[c]), _mm512_abs_ps(odd[c]));
  }
  for (int w = C / 2; w >= 1; w /= 2) {
    for (int s = 0; s < w; ++s) top[s] = _mm512_max_ps(top[s], top[s + w]);
  }
  const float amax = _mm512_reduce_max_ps(top[0]);
  const float scale = amax > 0.f ? 127.f / amax : 0.f;
  if (std::isinf(scale)) {
    // subnormals only: 127 / max|x| overflows and every q saturates, to -128 on the float
    // path; the words below would keep the low bits instead. That path's bytes, then.
    float f[QK];
    for (int i = 0; i < QK; ++i) f[i] = static_cast<float>(xb[i]);
    return quantize_block_avx512(f, o);
  }
  o.d = amax / 127.f;
  const __m512 inv = _mm512_set1_ps(scale);
  __m512i words[C], pairs[C];
  for (int c = 0; c < C; ++c) {
    const __m512i qe = _mm512_cvtps_epi32(_mm512_mul_ps(even[c], inv));
    const __m512i qo = _mm512_cvtps_epi32(_mm512_mul_ps(odd[c], inv));
    words[c] = _mm512_mask_blend_epi16(0xAAAAAAAA, qe, _mm512_slli_epi32(qo, 16));  // 32 q in order
    pairs[c] = _mm512_add_epi32(qe, qo);
  }
  // packs_epi16 takes 8 words of each operand per 128-bit lane: quarters (a0 b0 a1 b1 a2 b2
  // a3 b3) of 8 bytes, put back as (a0 a1 a2 a3 b0 b1 b2 b3)
  const __m512i order = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
  for (int a = 0; a < C / 2; ++a) {
    const __m512i bytes = _mm512_packs_epi16(words[2 * a], words[2 * a + 1]);
    _mm512_storeu_si512(o.q + 64 * a, _mm512_permutexvar_epi64(order, bytes));
  }
  // the sums of 16: piece c's pair sums over lanes 0-7 and 8-15. Per group of 4 pieces, the
  // 128-bit lane sums of each (sums_of_16's first stage), then lanes 0 + 1 and 2 + 3:
  // (p0 p1 p2 p3 lower halves, p0..p3 upper, p4..p7 lower, p4..p7 upper), put in order
  __m512i lanes[2];
  for (int g = 0; g < 2; ++g) {
    const __m512i* p = pairs + 4 * g;
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
    lanes[g] = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
  }
  const __m512i halves = _mm512_add_epi32(_mm512_shuffle_i32x4(lanes[0], lanes[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                          _mm512_shuffle_i32x4(lanes[0], lanes[1], _MM_SHUFFLE(3, 1, 3, 1)));
  store_sums(_mm512_permutexvar_epi32(_mm512_set_epi32(15, 11, 14, 10, 13, 9, 12, 8, 7, 3, 6, 2, 5, 1, 4, 0), halves),
             o);
}
#endif

// One 256-wide block of floats or bf16 quantised, with the sums every path reads.
template <typename T>
inline void quantize_block(const T* xb, Q8Block& o) {
#if DRAFTSMAN_AVX512_OPS
  quantize_block_avx512(xb, o);
#else
  float f[QK];
  for (int i = 0; i < QK; ++i) f[i] = static_cast<float>(xb[i]);
#if defined(__AVX2__)
  quantize_block_avx2(f, o);
#else
  quantize_block_scalar(f, o);
#endif
  int_offsets(o);
  for (int s = 0; s < QK / 16; ++s) o.q6_offsets[s] = -32 * o.bsums[s];
#endif
}

// Blocks b0..b1-1 of a row of k floats or bf16, block b at out[b * step], zero-padded past k
// (the last block through a zeroed copy): those blocks of the row padded to 256-multiples.
template <typename T>
inline void quantize_row_blocks(const T* x, int64_t k, int64_t b0, int64_t b1, Q8Block* out, int64_t step) {
  const int64_t whole = std::min(b1, k / QK);
  for (int64_t b = b0; b < whole; ++b) quantize_block(x + b * QK, out[b * step]);
  for (int64_t b = std::max(b0, whole); b < b1; ++b) {
    T tail[QK] = {};
    std::memcpy(tail, x + b * QK, sizeof(T) * static_cast<size_t>(std::max<int64_t>(0, std::min(k, (b + 1) * QK) - b * QK)));
    quantize_block(tail, out[b * step]);
  }
}

// The whole row as nb blocks.
template <typename T>
inline void quantize_row(const T* x, int64_t k, int64_t nb, Q8Block* out, int64_t step) {
  quantize_row_blocks(x, k, 0, nb, out, step);
}

// The 6-bit (scale, min) pair of Q4_K sub-block j.
inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q6_K element e (0..255) of one block, as 0..63.
inline int q6k_value(const uint8_t* w, int e) {
  const int half = e / 128, r = e % 128, chunk = r / 32, l = r % 32;
  const uint8_t* ql = w + 64 * half;
  const uint8_t* qh = w + 128 + 32 * half;
  // chunk 0: ql[l] low, 1: ql[l+32] low, 2: ql[l] high, 3: ql[l+32] high
  const uint8_t lb = ql[l + 32 * (chunk % 2)];
  const int lo4 = chunk < 2 ? (lb & 15) : (lb >> 4);
  const int hi2 = (qh[l] >> (2 * chunk)) & 3;
  return lo4 | (hi2 << 4);
}

// The block's 256 6-bit values in order, q[e] = q6k_value(blk, e), read a half (128) at a
// time: ql[l] holds elements l (low nibble) and l + 64 (high), ql[l + 32] elements l + 32 and
// l + 96, qh[l] the top 2 bits of all four (bits 0-1, 2-3, 4-5, 6-7).
inline void q6k_values(const uint8_t* blk, uint8_t* q) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = blk + 64 * half;
    const uint8_t* qh = blk + 128 + 32 * half;
    uint8_t* out = q + 128 * half;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<uint8_t>((ql[l] & 15) | ((qh[l] & 3) << 4));
      out[l + 32] = static_cast<uint8_t>((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
      out[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      out[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

// The fewest blocks a thread quantises in a region of its own: a call with fewer quantises them
// on the calling thread, faster than starting another (16 rows of 896 in one 16-row group:
// 10.2 -> 5.7 us a call). The records kernel instead shares its product's region from 32
// blocks (gguf_matmul_records.cpp: quantize_then_work), where no region is started for it.
constexpr int64_t QUANTIZE_GRAIN = 128;

// Rows r0..r1-1 of x [M, K] (float32 or bfloat16), blocks b0..b1-1 of each, as Q8Blocks into
// `out`, which holds `rows` rows of nb blocks, row-major (row r's block b at r * nb + b) or
// block-major (at b * rows + r); rows from M on are zero blocks (d = 0, q = 0, sums 0). A row
// narrower than the nb * 256 the weights were padded to (K not a multiple of 256, as a
// 0.5B's 896) is quantised as if padded with zeros: the same blocks as padding it first.
// Each block is quantised on its own: it never depends on the other rows or blocks, nor on
// who quantises it.
inline void quantize_part(const at::Tensor& x, int64_t r0, int64_t r1, int64_t b0, int64_t b1, int64_t rows,
                          int64_t nb, bool block_major, Q8Block* out) {
  const int64_t m = x.size(0), k = x.size(1);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  // row r's blocks written in place, one after another or `rows` apart
  const int64_t first = block_major ? 1 : nb, step = block_major ? rows : 1;
  for (int64_t r = r0; r < r1; ++r) {
    Q8Block* blocks = out + r * first;
    if (r < m) {
      if (bf16) {
        quantize_row_blocks(x.data_ptr<c10::BFloat16>() + r * k, k, b0, b1, blocks, step);
      } else {
        quantize_row_blocks(x.data_ptr<float>() + r * k, k, b0, b1, blocks, step);
      }
    } else {
      for (int64_t b = b0; b < b1; ++b) blocks[b * step] = Q8Block{};
    }
  }
}

// Every block of rows r0..r1-1.
inline void quantize_row_range(const at::Tensor& x, int64_t r0, int64_t r1, int64_t rows, int64_t nb,
                               bool block_major, Q8Block* out) {
  quantize_part(x, r0, r1, 0, nb, rows, nb, block_major, out);
}

// All `rows` rows so into `out` (rows * nb blocks), in a region of their own from
// QUANTIZE_GRAIN blocks a thread.
inline void quantize_rows_into(const at::Tensor& x, int64_t rows, int64_t nb, bool block_major, Q8Block* out) {
  const int64_t grain = std::max<int64_t>(1, (QUANTIZE_GRAIN + nb - 1) / nb);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    quantize_row_range(x, begin, end, rows, nb, block_major, out);
  });
}

// The same into `out`, which only grows, so that a caller may keep it across calls.
inline void quantize_rows_into(const at::Tensor& x, int64_t rows, int64_t nb, bool block_major,
                               std::vector<Q8Block>& out) {
  if (static_cast<int64_t>(out.size()) < rows * nb) out.resize(static_cast<size_t>(rows * nb));
  quantize_rows_into(x, rows, nb, block_major, out.data());
}

// Every row of x, row-major, as nb blocks each.
inline std::vector<Q8Block> quantize_rows(const at::Tensor& x, int64_t nb) {
  std::vector<Q8Block> out;
  quantize_rows_into(x, x.size(0), nb, false, out);
  return out;
}

}  // namespace draftsman_kquant
