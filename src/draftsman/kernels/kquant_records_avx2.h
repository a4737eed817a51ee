// Q4_K and Q6_K records (kquant_records.h) on AVX2 alone: the records path for CPUs without
// AVX-512 (Zen 2/3 EPYCs, older Xeons). gguf_matmul_records.cpp dispatches here.
//
// The per-row AVX2 path (gguf_matmul.cpp) holds 32 weights of one weight row in a ymm and
// pays two multiplies per 32 products and row (vpmaddubsw, then vpmaddwd by the sub-block's
// scale), plus a horizontal sum. Here a ymm holds 8 columns x 4 k of a record, one
// vpmaddubsw multiplies them by one activation row's 4 bytes (broadcast), and the int16 pair
// sums of a whole sub-block add up in place before one vpmaddwd by the columns' scales
// widens them: 9 multiplies per 256 products and row for Q4_K instead of 16, nothing summed
// across lanes, and a record read once serves every row while it sits in L1.
//
// Exact integers, as on the VNNI path: per block, activation row m, column n,
//   Q4_K: isum = sum_j sc_j C_j, msum = sum_j m_j psum_j, C_j = sum over sub-block j of
//         x_q q (|pair| <= 2 * 15 * 127 = 3810; 8 pairs of a 32-wide sub-block <= 30480 fit
//         int16; activations are in -127..127, so vpmaddubsw never saturates)
//   Q6_K: isum = sum_j sc_j C_j - 32 sum_j sc_j bsum_j (|pair| <= 2 * 63 * 127 = 16002: two
//         pairs fit int16, so a 16-wide sub-block is widened in two halves)
// then acc += (d d_x) isum - (dmin d_x) msum in float, in a fixed order per row: a row's
// output is the same alone or in any batch and thread count (batch invariance).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kquant_blocks.h"
#include "kquant_records.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && \
    !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__))
#include <immintrin.h>
#define DRAFTSMAN_RECORDS_AVX2 1
#else
#define DRAFTSMAN_RECORDS_AVX2 0
#endif

#if DRAFTSMAN_RECORDS_AVX2
namespace draftsman_avx2_records {

using draftsman_kquant::Q8Block;
using namespace draftsman_amx;  // the record layout's constants

// Rows per pass over a record half: 3 registers each (two int16 sums, one int32 total) beside
// the two weight vectors, a broadcast and the nibble mask, of AVX2's 16.
constexpr int PASS_ROWS = 4;
constexpr int AHEAD = 4;  // records ahead, fetched half a record before each half (a whole one at once was slower)

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 4 bytes at p in every 32-bit lane
inline __m256i broadcast4(const uint8_t* p) {
  return _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(p));
}

// 8 unsigned (or signed) bytes as 8 int32 lanes, each holding the value in both 16-bit halves:
// a vpmaddwd factor that scales both pair sums of a lane by its column's value.
inline __m256i pair_factor_u8(const uint8_t* p) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}
inline __m256i pair_factor_s8(const uint8_t* p) {
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

// c + p in int16 lanes, kept as one chain of adds: the empty asm makes the sum opaque, so that
// GCC's reassociation cannot turn the k-rows' chain into a tree, which kept every product of
// a sub-block alive at once and spilled them (a store and a load each, 2-3x the time)
inline __m256i add16(__m256i c, __m256i p) {
  c = _mm256_add_epi16(c, p);
  __asm__("" : "+x"(c));
  return c;
}

inline const uint8_t* quants(const Q8Block& xb) { return reinterpret_cast<const uint8_t*>(xb.q); }

// Columns 8h..8h+7 of one Q4_K record (PAIRS pairs of sub-blocks: 4, or 2 for a half record)
// against R <= PASS_ROWS rows; row m's block is xb[m * row_step], its 8 sums go to
// acc + 16 m + 8 h.
template <int R, int PAIRS>
inline void q4k_half(const uint8_t* w, int h, const Q8Block* xb, int64_t row_step, float* acc) {
  const __m256i low4 = _mm256_set1_epi8(15);
  // the rows' int32 totals live in L1, touched once a pair: registers hold the int16 sums
  // (2 a row), the weights and a broadcast (spilling them cost twice the time)
  alignas(32) int32_t isum[R][8] = {};
  for (int p = 0; p < PAIRS; ++p) {
    __m256i c[R][2];  // int16 pair sums of sub-blocks 2p and 2p + 1
    for (int m = 0; m < R; ++m) c[m][0] = c[m][1] = _mm256_setzero_si256();
    for (int r = 0; r < 8; ++r) {
      const __m256i v = load32(w + OFF_Q + 512 * p + 64 * r + 32 * h);
      const __m256i q0 = _mm256_and_si256(v, low4);
      const __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      for (int m = 0; m < R; ++m) {
        const uint8_t* x = quants(xb[m * row_step]) + 64 * p + 4 * r;
        c[m][0] = add16(c[m][0], _mm256_maddubs_epi16(q0, broadcast4(x)));
        c[m][1] = add16(c[m][1], _mm256_maddubs_epi16(q1, broadcast4(x + 32)));
      }
    }
    // sc_j C_j <= 63 * 32 * 127 * 15 per lane; 8 sub-blocks fit int32
    const __m256i f0 = pair_factor_u8(w + OFF_SC + 16 * (2 * p) + 8 * h);
    const __m256i f1 = pair_factor_u8(w + OFF_SC + 16 * (2 * p + 1) + 8 * h);
    for (int m = 0; m < R; ++m) {
      const __m256i add = _mm256_add_epi32(_mm256_madd_epi16(c[m][0], f0), _mm256_madd_epi16(c[m][1], f1));
      __m256i* t = reinterpret_cast<__m256i*>(isum[m]);
      _mm256_store_si256(t, _mm256_add_epi32(_mm256_load_si256(t), add));
    }
  }
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + OFF_D + 16 * h)));
  const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + OFF_DMIN + 16 * h)));
  for (int m = 0; m < R; ++m) {
    const Q8Block& x = xb[m * row_step];
    __m256i msum = _mm256_setzero_si256();
    for (int t = 0; t < 4; ++t) {  // (m_2t, m_2t+1) x (psum_2t, psum_2t+1) per column
      const __m256i mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + OFF_MIN + 32 * t + 16 * h)));
      msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins, broadcast4(reinterpret_cast<const uint8_t*>(x.psums + 2 * t))));
    }
    const __m256 dx = _mm256_set1_ps(x.d);
    float* out = acc + COLS * m + 8 * h;
    const __m256i total = _mm256_load_si256(reinterpret_cast<const __m256i*>(isum[m]));
    const __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(total), _mm256_loadu_ps(out));
    _mm256_storeu_ps(out, _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(msum), a));
  }
}

// Columns 8h..8h+7 of one Q6_K record against R <= PASS_ROWS rows, as q4k_half: sub-blocks
// 2p (low nibbles) and 2p + 1 (high) of pair p, 4 k-rows each, their 6-bit q rebuilt from the
// quad bytes (bits 2s, 2s + 1 of sub-block 4u + s moved to bits 4..5).
template <int R>
inline void q6k_half(const uint8_t* w, int h, const Q8Block* xb, int64_t row_step, float* acc) {
  const __m256i low4 = _mm256_set1_epi8(15), hi2 = _mm256_set1_epi8(0x30);
  __m256i isum[R];
  for (int m = 0; m < R; ++m) isum[m] = _mm256_setzero_si256();
  for (int p = 0; p < 8; ++p) {
    const __m256i fa = pair_factor_s8(w + Q6_OFF_SC + 16 * (2 * p) + 8 * h);
    const __m256i fb = pair_factor_s8(w + Q6_OFF_SC + 16 * (2 * p + 1) + 8 * h);
    __m256i c[R][2];  // int16 pair sums of two k-rows of sub-blocks 2p and 2p + 1
    for (int r = 0; r < 4; ++r) {
      const __m256i v = load32(w + Q6_OFF_QL + 256 * p + 64 * r + 32 * h);
      const __m256i hq = load32(w + Q6_OFF_QH + 256 * (p / 2) + 64 * r + 32 * h);
      const bool first = p % 2 == 0;
      const __m256i ha = first ? _mm256_slli_epi16(hq, 4) : hq;
      const __m256i hb = first ? _mm256_slli_epi16(hq, 2) : _mm256_srli_epi16(hq, 2);
      const __m256i qa = _mm256_or_si256(_mm256_and_si256(v, low4), _mm256_and_si256(ha, hi2));
      const __m256i qb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), _mm256_and_si256(hb, hi2));
      for (int m = 0; m < R; ++m) {
        const uint8_t* x = quants(xb[m * row_step]) + 32 * p + 4 * r;
        const __m256i pa = _mm256_maddubs_epi16(qa, broadcast4(x));
        const __m256i pb = _mm256_maddubs_epi16(qb, broadcast4(x + 16));
        if (r % 2 == 0) {
          c[m][0] = pa;
          c[m][1] = pb;
        } else {  // two k-rows: <= 32004, then widened by the columns' scales
          isum[m] = _mm256_add_epi32(isum[m], _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(c[m][0], pa), fa),
                                                               _mm256_madd_epi16(_mm256_add_epi16(c[m][1], pb), fb)));
        }
      }
    }
  }
  // the -32 of (q - 32): sum_j sc_j bsum_j as pairs of sub-blocks (sc_2t, sc_2t+1) per column
  __m256i scale_pairs[8];
  for (int t = 0; t < 8; ++t) {
    const __m128i a = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + Q6_OFF_SC + 16 * (2 * t) + 8 * h)));
    const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + Q6_OFF_SC + 16 * (2 * t + 1) + 8 * h)));
    scale_pairs[t] = _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
  }
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + Q6_OFF_D + 16 * h)));
  for (int m = 0; m < R; ++m) {
    const Q8Block& x = xb[m * row_step];
    __m256i bias = _mm256_setzero_si256();  // |sum_j sc_j bsum_j| <= 16 * 128 * 2032
    for (int t = 0; t < 8; ++t) {
      bias = _mm256_add_epi32(bias, _mm256_madd_epi16(scale_pairs[t], broadcast4(reinterpret_cast<const uint8_t*>(x.bsums + 2 * t))));
    }
    const __m256i total = _mm256_sub_epi32(isum[m], _mm256_slli_epi32(bias, 5));
    float* out = acc + COLS * m + 8 * h;
    _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x.d)), _mm256_cvtepi32_ps(total), _mm256_loadu_ps(out)));
  }
}

// f(std::integral_constant<int, R>{}) for R = rows (1 <= rows <= PASS_ROWS)
template <int R = 1, typename F>
inline void with_rows(int rows, F&& f) {
  if constexpr (R >= PASS_ROWS) {
    f(std::integral_constant<int, PASS_ROWS>{});
  } else {
    if (rows <= R) return f(std::integral_constant<int, R>{});
    with_rows<R + 1>(rows, f);
  }
}

// One group of 16 weight rows (nb records, the last half where `half`) against `rows`
// activation rows: acc[m * 16 + c] += row m's products. Each record half passes every pass
// of up to PASS_ROWS rows (as even as they go) while it sits in L1, so the record is read
// from memory once. Row m's block b is x[m * row_step + b * block_step].
inline void group(const uint8_t* w, int64_t qtype, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                  int64_t block_step, int rows, float* acc) {
  const bool q4 = qtype == draftsman_kquant::TYPE_Q4_K;
  const int passes = (rows + PASS_ROWS - 1) / PASS_ROWS;
  const int pass = (rows + passes - 1) / passes;
  for (int64_t b = 0; b < nb; ++b) {
    const bool half_record = half && b == nb - 1;
    const int bytes = q4 ? (half_record ? half_record_bytes(qtype) : RECORD) : Q6_RECORD;
    for (int h = 0; h < 2; ++h) {
      for (int off = h * bytes / 2; off < (h + 1) * bytes / 2; off += 64) _mm_prefetch(reinterpret_cast<const char*>(w) + AHEAD * bytes + off, _MM_HINT_T0);
      for (int m0 = 0; m0 < rows; m0 += pass) {
        const Q8Block* xb = x + b * block_step + m0 * row_step;
        float* out = acc + COLS * m0;
        with_rows(std::min(pass, rows - m0), [&](auto r) {
          constexpr int R = decltype(r)::value;
          if (!q4) {
            q6k_half<R>(w, h, xb, row_step, out);
          } else if (half_record) {
            q4k_half<R, HALF_PAIRS>(w, h, xb, row_step, out);
          } else {
            q4k_half<R, 4>(w, h, xb, row_step, out);
          }
        });
      }
    }
    w += bytes;
  }
}

}  // namespace draftsman_avx2_records
#endif
