// Two groups of 16 weight rows (32 output columns) against the same activation rows at once:
// the K-quant records' vector path for a verify's many rows (from 6: `pair_groups` in
// gguf_matmul_records.cpp, which says why not fewer).
//
// Why: on a Zen 5 core a vector load is the scarce thing, not the multiply. It issues two
// vpdpbusd and two vector loads a cycle, and the one-group path spends a load per product
// (each row's 4 activations broadcast for one vpdpbusd) plus the weight vectors: 18 loads per
// 16 products, so 16 rows ran at 35 reference cycles a record-row from L2 against
// vpdpbusd's floor of 21 (scripts/records_cycles.py --single; a microbenchmark, products a
// reference cycle: 16 broadcast products 2.9, with 2 more vector loads 2.6, with 4 more 2.3).
// Here each row's broadcast is loaded once into a register and multiplies both groups'
// weights, so a step of R rows is 2 weight loads and R broadcasts for 2R products, and the
// sub-block scales, the finish and the loop overhead are paid per 32 columns instead of 16
// (16 rows from L2: Q4_K 35 -> 30, Q6_K 45 -> 35 cycles; bench-results/profile-zen5-pairs).
//
// One sub-block at a time (its 2R sums, the rows' 2R totals and 2 weight vectors: 4R + 2
// registers, R <= PAIR_ROWS). Each row's arithmetic is the one-group path's, in the same
// order (sub-block sums exact in int32, folded into its total j = 0, 1, ... by Sum, then
// the same finish), so its output bits do not depend on the path, the pairing or the rows
// beside it: batch invariance holds across all of them.
#pragma once

#include <cstdint>

#include "kquant_records_parts.h"

#if DRAFTSMAN_RECORDS
namespace draftsman_amx {

constexpr int PAIR_ROWS = 6;  // rows a pass: 16 as 6 + 5 + 5 (passes of 4-6 measured level)

// Where group a's stream prefetches while block b of a pair is worked (b's record at w):
// AHEAD / 2 steps on in the pair's order of work (a step: block b of both groups, as many
// bytes as AHEAD records of one group), past the last block into the next unit's group a,
// next_unit bytes on (two groups; one where units pair gate group g with up group g); group
// b's stream: this plus group b's distance from group a. Each group AHEAD records past its own
// record, as the one-group path fetches, lands in group b's records (already read) at a
// pair's end and leaves the next pair's group b unfetched for its first blocks, all of them
// where a group has few (the 1.5B q4, 16 rows, a Zen 5 EPYC, in the same hour: down_proj
// Q6_K 5.9-6.4 -> 5.3-6.0 ms and Q4_K 5.0-5.1 -> 4.4-5.0 over 28 layers, the lm_head 6.7-7.7
// -> 6.7-6.8; records harness from memory, K = 8960, 16 rows: Q4_K 31.9-32.8 -> 29.3-29.4,
// Q6_K 38.0-41.5 -> 34.1-36.5 reference cycles a record-row).
inline const uint8_t* pair_ahead(const uint8_t* w, int64_t b, int64_t nb, int64_t next_unit, int bytes) {
  const int64_t step = b + RecordPrefetch::AHEAD / 2;
  return w + step / nb * next_unit + (step % nb - b) * bytes;
}

// Row m's 4 activations at x in every lane, loaded once for both groups' products.
inline __m512i broadcast_row(const uint8_t* x) { return _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x)); }

// ca[m] += qa . x_m, cb[m] += qb . x_m for R rows: row m's 4 activations at x + m * xstride,
// loaded once for both groups' weight vectors qa, qb.
template <int R>
inline void rows_times_pair(const uint8_t* x, int64_t xstride, __m512i qa, __m512i qb, __m512i* ca, __m512i* cb) {
  for (int m = 0; m < R; ++m) {
    const __m512i xm = broadcast_row(x + m * xstride);
    ca[m] = _mm512_dpbusd_epi32(ca[m], qa, xm);
    cb[m] = _mm512_dpbusd_epi32(cb[m], qb, xm);
  }
}

// Each row's sums of one sub-block folded into its totals, by each group's scale factor.
template <int R, typename Sum>
inline void fold_pair(const __m512i* ca, const __m512i* cb, typename Sum::Factor fa, typename Sum::Factor fb,
                      typename Sum::Vec* ia, typename Sum::Vec* ib) {
  for (int m = 0; m < R; ++m) {
    ia[m] = Sum::add(ia[m], ca[m], fa);
    ib[m] = Sum::add(ib[m], cb[m], fb);
  }
}

// Sub-block j's nibbles, k-row r, of a Q4_K record, unpacked as Q4kRecord unpacks them (the
// high nibble in place as 16 q where Sum takes it so).
template <typename Sum>
inline __m512i q4k_sub_block(const uint8_t* w, int j, int r) {
  const __m512i low4 = _mm512_set1_epi8(15);
  const __m512i v = _mm512_loadu_si512(w + OFF_Q + 512 * (j / 2) + 64 * r);
  if (j % 2 == 0) return _mm512_and_si512(v, low4);
  if constexpr (Sum::HIGH_IN_PLACE) return _mm512_andnot_si512(low4, v);
  return _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
}

// One Q4_K block of groups a and b against R rows, the weights unpacked in registers from the
// records wa, wb (each pass unpacks again: two ALU operations a weight vector, cheaper than
// storing them for the next pass). SUBS: 8 sub-blocks, or 4 for a half record. Row m's block
// is xb[m * row_step], its quants at xq + m * xstride; its sums go to acca / accb + 16 m.
template <int R, typename Sum, int SUBS>
inline void q4k_block_pair(const uint8_t* wa, const uint8_t* wb, const Q4kScales<Sum>& sa,
                           const Q4kScales<Sum>& sb, const uint8_t* xq, int64_t xstride, const Q8Block* xb,
                           int64_t row_step, float* acca, float* accb, RecordPrefetch& aheada,
                           RecordPrefetch& aheadb) {
  typename Sum::Vec ia[R], ib[R];
  for (int m = 0; m < R; ++m) ia[m] = ib[m] = Sum::zero();
  for (int j = 0; j < SUBS; ++j) {
    __m512i ca[R], cb[R];
    for (int m = 0; m < R; ++m) ca[m] = cb[m] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      if (r % 2 == 0) {
        aheada.line();
      } else {
        aheadb.line();
      }
      rows_times_pair<R>(xq + 32 * j + 4 * r, xstride, q4k_sub_block<Sum>(wa, j, r), q4k_sub_block<Sum>(wb, j, r),
                         ca, cb);
    }
    // |C_j| <= 32 * 127 * 15 (16 q: * 16) and sc_j <= 63: each total fits int32
    fold_pair<R, Sum>(ca, cb, sa.sc[j], sb.sc[j], ia, ib);
  }
  for (int m = 0; m < R; ++m) {
    q4k_finish_row(Sum::to_float(ia[m]), sa.mins, sa.d, sa.dmin, xb[m * row_step], acca + COLS * m);
    q4k_finish_row(Sum::to_float(ib[m]), sb.mins, sb.d, sb.dmin, xb[m * row_step], accb + COLS * m);
  }
}

// One Q6_K block of groups a and b against R rows, from their weights unpacked once into
// ua, ub (Q6kUnpacked's layout: sub-block j, k-row r at 256 j + 64 r; unpacking a Q6_K
// vector takes ~10 operations, so passes share it). Each sub-block's sums start at the row's
// -32 bsum_j, as the one-group path's.
template <int R, typename Sum>
inline void q6k_block_pair(const uint8_t* ua, const uint8_t* ub, const Q6kScales<Sum>& sa,
                           const Q6kScales<Sum>& sb, const uint8_t* xq, int64_t xstride, const Q8Block* xb,
                           int64_t row_step, float* acca, float* accb, RecordPrefetch& aheada,
                           RecordPrefetch& aheadb) {
  typename Sum::Vec ia[R], ib[R];
  for (int m = 0; m < R; ++m) ia[m] = ib[m] = Sum::zero();
  for (int j = 0; j < 16; ++j) {
    __m512i ca[R], cb[R];
    for (int m = 0; m < R; ++m) ca[m] = cb[m] = _mm512_set1_epi32(xb[m * row_step].q6_offsets[j]);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      aheada.line();  // 64 steps a block: 53 lines each
      aheadb.line();
      rows_times_pair<R>(xq + 16 * j + 4 * r, xstride, _mm512_load_si512(ua + 256 * j + 64 * r),
                         _mm512_load_si512(ub + 256 * j + 64 * r), ca, cb);
    }
    // |C_j - 32 bsum_j| <= 16 * 127 * 32 and |sc_j| <= 128: the sum over 16 fits int32
    fold_pair<R, Sum>(ca, cb, sa.sc[j], sb.sc[j], ia, ib);
  }
  for (int m = 0; m < R; ++m) {
    q6k_finish_row(Sum::to_float(ia[m]), sa.d, xb[m * row_step], acca + COLS * m);
    q6k_finish_row(Sum::to_float(ib[m]), sb.d, xb[m * row_step], accb + COLS * m);
  }
}

}  // namespace draftsman_amx
#endif
