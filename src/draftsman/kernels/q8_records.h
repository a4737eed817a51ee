// The 8-bit paths of the records kernel (gguf_matmul_records.cpp; layouts in
// kquant_records.h): Q8_0 blocks of 32, each with its own f16 scale, and int8 rows with one
// scale each, against activations in int8 per 256 (Q8Block), 16 columns a vpdpbusd. Each
// record's block function is `byte_block_vectors`, overloaded on its scales.
//
// Per record (16 columns x 256 k), activation row m and column n, block j of 32:
//   C_j = sum_k x_q[m, k] (q[n, k] + 128) - 128 psum_j[m] = sum_k x_q q  (exact in int32:
//         the accumulators start at Q8Block::q8_offsets, |C_j| <= 32 * 128 * 127 < 2^24)
//   isum = sum_j d_j[n] C_j  (float fused multiply-adds, in j order; C_j is an exact float)
//   acc = acc + d_x[m] isum
// int8 rows (one scale per column n, TYPE_I8_ROW) need no per-block fold: one integer over
// the whole record, C = sum_k x_q (q + 128) - 128 sum_k x_q = sum_k x_q q (|C| <= 256 * 128 *
// 127 < 2^24, exact as a float), then acc = acc + (d[n] d_x[m]) C: per row and record 64
// vpdpbusd and 3 other vector operations instead of Q8_0's 64 and 19.
// Every row's arithmetic is its own, in a fixed order, on every CPU with the records, so a
// row's output is the same alone or in any batch and thread count. Both take AMX tiles where
// the caller asks (byte_tiles.h: the same integers and float steps, the same bits).
#pragma once

#include "kquant_records_parts.h"

#if DRAFTSMAN_RECORDS
namespace draftsman_amx {

// Weights of sub-blocks 2p (q0) and 2p + 1 (q1), k-row r, of a record whose bytes (q + 128,
// laid out as Q8_0's) start at OFF: stored unsigned, nothing to unpack.
template <int OFF>
struct ByteRecord {
  const uint8_t* w;
  void operator()(int p, int r, __m512i* q0, __m512i* q1) const {
    *q0 = _mm512_loadu_si512(w + OFF + 512 * (2 * p) + 64 * r);
    *q1 = _mm512_loadu_si512(w + OFF + 512 * (2 * p + 1) + 64 * r);
  }
};

// The "unpacked" form several passes of rows read: the record itself (it sits in L1).
template <int OFF>
struct ByteUnpacked {
  static constexpr int BYTES = 64;
  uint8_t* unused;
  const uint8_t* w = nullptr;
  void unpack(const uint8_t* record, bool /*half*/) { w = record; }
  void operator()(int p, int r, __m512i* q0, __m512i* q1) const { ByteRecord<OFF>{w}(p, r, q0, q1); }
};

// The products of one pair of blocks (2p, 2p + 1) for R rows: c[m][0] += row m's sums over
// block 2p, c[m][1] over 2p + 1, two lines of the record ahead fetched a step (the record's
// 65-68 lines over its 32 steps; the rest after it).
template <int R, typename Weights>
inline void byte_pair_products(const Weights& weights, int p, const uint8_t* xq, int64_t xstride,
                               __m512i (*c)[2], RecordPrefetch& ahead) {
  for (int r = 0; r < 8; ++r) {
    ahead.line();
    ahead.line();
    __m512i q0, q1;
    weights(p, r, &q0, &q1);
    rows_dpbusd<R>(xq + 64 * p + 4 * r, xstride, 32, q0, q1, c);
  }
}

// A record's block scales as floats, [block j][16 columns].
struct Q8Scales {
  static constexpr int64_t QTYPE = TYPE_Q8_0;
  static constexpr int WEIGHTS = Q8_OFF_Q;
  __m512 d[8];
  explicit Q8Scales(const uint8_t* w) {
    for (int j = 0; j < 8; ++j) {
      d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + Q8_OFF_D + 32 * j)));
    }
  }
};

// One Q8_0 record against R rows in registers (row m's block at xb[m * row_step], its int8
// quants at xq + m * xstride), each pair of blocks folded into isum as it completes; PAIRS
// pairs of blocks (4, or HALF_PAIRS for a half record).
template <int R, int PAIRS, typename Weights>
inline void byte_block_vectors(const Weights& weights, const uint8_t* xq, int64_t xstride, const Q8Scales& s,
                               const Q8Block* xb, int64_t row_step, float* acc, RecordPrefetch& ahead) {
  __m512 isum[R];
  for (int m = 0; m < R; ++m) isum[m] = _mm512_setzero_ps();
  for (int p = 0; p < PAIRS; ++p) {
    __m512i c[R][2];  // C_j: the -128 psum_j offsets first
    for (int m = 0; m < R; ++m) {
      const Q8Block& x = xb[m * row_step];
      c[m][0] = _mm512_set1_epi32(x.q8_offsets[2 * p]);
      c[m][1] = _mm512_set1_epi32(x.q8_offsets[2 * p + 1]);
    }
    byte_pair_products<R>(weights, p, xq, xstride, c, ahead);
    for (int m = 0; m < R; ++m) {
      isum[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[m][0]), s.d[2 * p], isum[m]);
      isum[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[m][1]), s.d[2 * p + 1], isum[m]);
    }
  }
  for (int m = 0; m < R; ++m) {
    float* a = acc + COLS * m;
    _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_set1_ps(xb[m * row_step].d), isum[m], _mm512_loadu_ps(a)));
  }
}

// A record's 16 column scales.
struct I8Scales {
  static constexpr int64_t QTYPE = TYPE_I8_ROW;
  static constexpr int WEIGHTS = I8_OFF_Q;
  __m512 d;
  explicit I8Scales(const uint8_t* w) : d(_mm512_loadu_ps(w + I8_OFF_D)) {}
};

// The rows from which an int8-row record's products take one accumulator each (up to 16 in
// one pass, i8_many_rows); below, two (byte_block_vectors).
constexpr int I8_ONE_SUM_ROWS = 9;

// Rows of a many-row pass whose 4 activations come from a shuffle instead of a broadcast load.
// Why: a Zen 5 core loads two vectors a cycle, and a vpdpbusd with its activations broadcast
// from memory spends one of them, so with the weight vectors and the prefetches a pass ran on
// its loads rather than its two vpdpbusd a cycle. A row here loads 16 bytes (4 k-rows' 4
// activations) into each 128-bit lane once per 4 k-rows and vpshufd picks each k-row's 4,
// on a pipe the products leave free (a microbenchmark of this loop from L1, 16 rows: 42.0 ->
// 39.0-40.0 reference cycles for its 128 products with 2-4 such rows, 40.4 with 6; the
// kernel from L2, 16 rows a record: 24.0 reference cycles a record-row with none, 21.1-22.1
// with 3; bench-results/profile-zen5-int8-one-pass).
constexpr int I8_SHUFFLED_ROWS = 3;

// Row m's 4 activations for k-row 4 h + R4 of its 16 bytes `lanes` (loaded to every lane).
template <int R4>
inline __m512i pick_k_row(__m512i lanes) {
  return _mm512_shuffle_epi32(lanes, static_cast<_MM_PERM_ENUM>(0x55 * R4));
}

// A row's 16 activations (4 k-rows) in every 128-bit lane; the empty asm keeps the compiler
// from folding load and shuffle back into a broadcast load per product.
inline __m512i four_k_rows(const uint8_t* x) {
  __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  __asm__("" : "+v"(v));
  return v;
}

// One int8-row record against R rows in one pass (I8_ONE_SUM_ROWS <= R <= 16): one accumulator
// a row over the record, started at the sum of its two offsets, so the integer is the few-row
// path's two accumulators added (exact: |C| < 2^24) and the float finish is the same.
// The rows' blocks lie one after another (block-major, row_step 1: the caller lays them out
// so from I8_ONE_SUM_ROWS rows), so every activation is one pointer and a constant offset:
// with a stride known only at run time, 16 rows' addresses took 16 registers, and the
// compiler spilled them and reloaded them from the stack, loads the loop has none to spare.
template <int R, int PAIRS, typename Weights>
inline void i8_many_rows(const Weights& weights, const uint8_t* xq, const I8Scales& s, const Q8Block* xb,
                         float* acc, RecordPrefetch& ahead) {
  constexpr int S = I8_SHUFFLED_ROWS;
  constexpr int64_t xstride = sizeof(Q8Block);
  __m512i c[R];
  for (int m = 0; m < R; ++m) {
    const Q8Block& x = xb[m];
    c[m] = _mm512_set1_epi32(x.i8_offsets[0] + x.i8_offsets[1]);
  }
  const auto step = [&]<int R4>(int p, int h, const __m512i (&lanes)[S][2]) {
    const int r = 4 * h + R4;
    ahead.line();
    ahead.line();
    __m512i q[2];
    weights(p, r, &q[0], &q[1]);
    for (int half = 0; half < 2; ++half) {
      for (int m = 0; m < S; ++m) c[m] = _mm512_dpbusd_epi32(c[m], q[half], pick_k_row<R4>(lanes[m][half]));
      for (int m = S; m < R; ++m) c[m] = dpbusd_broadcast(c[m], q[half], xq + m * xstride + 64 * p + 32 * half + 4 * r);
    }
  };
  for (int p = 0; p < PAIRS; ++p) {
    for (int h = 0; h < 2; ++h) {
      __m512i lanes[S][2];
      for (int m = 0; m < S; ++m) {
        lanes[m][0] = four_k_rows(xq + m * xstride + 64 * p + 16 * h);
        lanes[m][1] = four_k_rows(xq + m * xstride + 64 * p + 32 + 16 * h);
      }
      step.template operator()<0>(p, h, lanes);
      step.template operator()<1>(p, h, lanes);
      step.template operator()<2>(p, h, lanes);
      step.template operator()<3>(p, h, lanes);
    }
  }
  for (int m = 0; m < R; ++m) {
    float* a = acc + COLS * m;
    const __m512 dd = _mm512_mul_ps(s.d, _mm512_set1_ps(xb[m].d));
    _mm512_storeu_ps(a, _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(c[m]), _mm512_loadu_ps(a)));
  }
}

// One int8-row record against R rows (up to 8: two accumulators each, the even and odd
// sub-blocks, whose two chains keep the vpdpbusd units busy at few rows; from
// I8_ONE_SUM_ROWS, i8_many_rows); PAIRS as above.
template <int R, int PAIRS, typename Weights>
inline void byte_block_vectors(const Weights& weights, const uint8_t* xq, int64_t xstride, const I8Scales& s,
                               const Q8Block* xb, int64_t row_step, float* acc, RecordPrefetch& ahead) {
  if constexpr (R >= I8_ONE_SUM_ROWS) {
    return i8_many_rows<R, PAIRS>(weights, xq, s, xb, acc, ahead);  // row_step 1
  }
  __m512i c[R][2];
  for (int m = 0; m < R; ++m) {
    const Q8Block& x = xb[m * row_step];
    c[m][0] = _mm512_set1_epi32(x.i8_offsets[0]);
    c[m][1] = _mm512_set1_epi32(x.i8_offsets[1]);
  }
  for (int p = 0; p < PAIRS; ++p) byte_pair_products<R>(weights, p, xq, xstride, c, ahead);
  for (int m = 0; m < R; ++m) {
    float* a = acc + COLS * m;
    const __m512 dd = _mm512_mul_ps(s.d, _mm512_set1_ps(xb[m * row_step].d));
    const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(c[m][0], c[m][1]));
    _mm512_storeu_ps(a, _mm512_fmadd_ps(dd, sum, _mm512_loadu_ps(a)));
  }
}

}  // namespace draftsman_amx
#endif
