// y = x W^T for Q4_K, Q6_K and Q8_0 matrices repacked once at load into records of 16 weight rows
// (`kquant_pack_records`, gguf_pack_records.cpp; layout in kquant_records.h), on AVX-512
// VNNI vectors and, where the CPU has them, AMX-INT8 tiles.
//
// The per-row paths (gguf_matmul.cpp) take one weight row at a time and spend a few
// instructions per 64 weights per activation row plus a horizontal sum, so verifying 16 rows
// costs ~3 single-row forwards. Here a record puts 16 weight rows (columns) side by side:
// one vpdpbusd multiplies 4 k of all 16 columns by one activation row's 4 bytes, each
// column in its own int32 lane, so nothing is summed across lanes and a record read from
// memory once serves every activation row while it sits in L1. A tile multiply (AMX) takes
// 16 activation rows x 16 columns x 64 k in one instruction; the sub-block scales are
// folded into the weights as they are unpacked, so that two tile sums per block give each
// row's exact integer. Past the tiles, 16 rows are compute-bound on the vector work around
// them (unpacking, scales), not on the tiles: that work is what the record layout is
// arranged to cut. The prefetcher, tile configuration and per-row finish are in
// kquant_records_parts.h.
//
// Per block, activation row m and column n, C_j = sum over sub-block j of x_q[m, k] q[n, k]
// (exact in int32):
//   Q4_K: isum = sum_j sc_j[n] C_j,  msum = sum_j m_j[n] psum_j[m]  (exact integers),
//         acc = acc + (d[n] d_x[m]) isum - (dmin[n] d_x[m]) msum  (two fused float ops)
//   Q6_K: isum = sum_j sc_j[n] (C_j - 32 bsum_j[m])  (exact integers),
//         acc = acc + (d[n] d_x[m]) isum  (one fused float op)
// isum is added up in int32 where tiles run (IntSum) and in float on vectors alone (FloatSum,
// the same value below 2^24; kquant_records_parts.h).
// Invariant (batch invariance): row m's arithmetic, in this order, is the same whatever
// other rows share its tile, so a row's output is the same alone or in any batch and thread
// count.

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <omp.h>
#include <torch/library.h>

#include "check_message.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <unistd.h>

#include "greedy_lanes.h"
#include "kquant_records_avx2.h"
#include "kquant_records_parts.h"
#include "byte_tiles.h"
#include "kquant_records_pairs.h"
#include "simd_math.h"

namespace {

using namespace draftsman_kquant;
using namespace draftsman_amx;

// Where AMX runs, the caller says from how many rows the tiles take over from vpdpbusd (the
// same exact sums either way): the crossing differs between AMX CPUs (tiles faster from 6
// rows on one Xeon, from 16 on an Emerald Rapids core, bench-results/host-amx-h200), so
// kernels/tile_rows.py measures it once per machine. Past 16 rows (prefill, batched steps)
// the tiles take every whole tile.

// f(std::integral_constant<int, R>{}) for R = rows, 1 <= rows <= MAX (MAX if more): one
// instantiation of a vector path per row count.
template <int MAX, int R = 1, typename F>
inline void with_vector_rows(int rows, F&& f) {
  if constexpr (R >= MAX) {
    f(std::integral_constant<int, MAX>{});
  } else {
    if (rows <= R) return f(std::integral_constant<int, R>{});
    with_vector_rows<MAX, R + 1>(rows, f);
  }
}

// Without tiles (an AVX-512 VNNI CPU without AMX, or DRAFTSMAN_KQUANT_AMX=0 asking for the
// vectors), more rows than one vector pass takes (`max`, the block type's PASS_ROWS) are
// split into passes as even as they go (16 rows of Q4_K: 8 x 2), each block's record passing
// every pass while it sits in L1: the record is read from memory once and unpacked once
// (UnpackedWeights), each pass loading the unpacked bytes.
inline int vector_pass_rows(int rows, int max) {
  const int passes = (rows + max - 1) / max;
  return (rows + passes - 1) / passes;
}

#if DRAFTSMAN_RECORDS

// The nibbles of Q4_K sub-blocks 2p (q0) and 2p + 1 (q1), k-row r of their VNNI layout in a
// record, unpacked in registers as they are used. Sum::HIGH_IN_PLACE: q1 is the high nibble
// left where it is, 16 q (one and instead of a shift and an and; the sums stay far inside
// int32), which Sum's factors for odd sub-blocks undo exactly.
template <typename Sum>
struct Q4kRecord {
  const uint8_t* w;
  void operator()(int p, int r, __m512i* q0, __m512i* q1) const {
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512i v = _mm512_loadu_si512(w + OFF_Q + 512 * p + 64 * r);
    *q0 = _mm512_and_si512(v, low4);
    if constexpr (Sum::HIGH_IN_PLACE) {
      *q1 = _mm512_andnot_si512(low4, v);
    } else {
      *q1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
  }
};

// The same from a record's weights unpacked once by `Source` into bytes (4 KiB, L1),
// [pair p][first, second][step r][64] for PAIRS pairs of sub-blocks of STEPS k-rows each:
// several passes of rows over one block then pay loads instead of the unpacking each.
template <typename Source, int PAIRS, int STEPS>
struct UnpackedWeights {
  static constexpr int BYTES = 128 * PAIRS * STEPS;
  uint8_t* u;  // BYTES, 64-byte aligned
  void unpack(const uint8_t* w, bool half) {  // a half record: its first half of the pairs
    const Source source{w};
    for (int p = 0; p < (half ? PAIRS / 2 : PAIRS); ++p) {
      for (int r = 0; r < STEPS; ++r) {
        __m512i a, b;
        source(p, r, &a, &b);
        _mm512_store_si512(u + 128 * STEPS * p + 64 * r, a);
        _mm512_store_si512(u + 128 * STEPS * p + 64 * (STEPS + r), b);
      }
    }
  }
  void operator()(int p, int r, __m512i* a, __m512i* b) const {
    *a = _mm512_load_si512(u + 128 * STEPS * p + 64 * r);
    *b = _mm512_load_si512(u + 128 * STEPS * p + 64 * (STEPS + r));
  }
};
template <typename Sum>
using Q4kUnpacked = UnpackedWeights<Q4kRecord<Sum>, 4, 8>;

// One Q4_K block against R <= Q4kPath::PASS_ROWS rows (where tiles run, fewer than they pay
// for): each unpacked
// vector of weights meets the rows in registers (vpdpbusd: 4 unsigned weights x 4 signed
// activations into each column's lane), C_j of sub-block j accumulated per row, then
// isum = sum_j sc_j C_j; nothing goes through memory between the unpacking and the products.
// Each pair of sub-blocks is folded into isum as it completes (registers for 8 rows).
// Row m's block is xb[m * row_step]; its int8 quants start at xq + m * xstride.
// Weights: Q4kRecord (unpacked as they are used) or Q4kUnpacked (unpacked once per block for
// several passes of rows). PAIRS: 4, or HALF_PAIRS for a half record.
template <int R, typename Sum, int PAIRS, typename Weights>
inline void q4k_block_vectors(const Weights& weights, const uint8_t* xq, int64_t xstride,
                              const typename Sum::Factor* sc, const __m512i* mins, __m512 d, __m512 dmin,
                              const Q8Block* xb, int64_t row_step, float* acc, RecordPrefetch& ahead) {
  typename Sum::Vec isum[R];
  for (int m = 0; m < R; ++m) isum[m] = Sum::zero();
  for (int p = 0; p < PAIRS; ++p) {
    __m512i c[R][2];
    for (int m = 0; m < R; ++m) c[m][0] = c[m][1] = _mm512_setzero_si512();
    for (int r = 0; r < 8; ++r) {
      ahead.line();
      __m512i q0, q1;
      weights(p, r, &q0, &q1);
      rows_dpbusd<R>(xq + 64 * p + 4 * r, xstride, 32, q0, q1, c);
    }
    // |C_j| <= 32 * 127 * 15 and sc_j <= 63: the sum over 8 sub-blocks fits int32
    for (int m = 0; m < R; ++m) {
      isum[m] = Sum::add(Sum::add(isum[m], c[m][0], sc[2 * p]), c[m][1], sc[2 * p + 1]);
    }
  }
  for (int m = 0; m < R; ++m) {
    q4k_finish_row(Sum::to_float(isum[m]), mins, d, dmin, xb[m * row_step], acc + COLS * m);
  }
}

#if DRAFTSMAN_AMX
// C0 = sum_k x_q B0, C1 = sum_k x_q B1 over one 256-k block for one tile of activation rows
// (xq: the tile's first row, rows xstride bytes apart), stored to cbuf[0], cbuf[1]; b0[c],
// b1[c]: the B operands of k 64c..64c+63. Signed weights (Q6_K's split products) or unsigned
// (Q4_K's scaled nibbles).
template <bool SIGNED_WEIGHTS>
inline void block_two_sums(const uint8_t* xq, int64_t xstride, const uint8_t (*b0)[16 * 64],
                           const uint8_t (*b1)[16 * 64], int32_t (*cbuf)[TILE_ROWS * COLS]) {
  _tile_zero(0);
  _tile_zero(1);
  for (int c = 0; c < 4; c += 2) {
    _tile_loadd(2, xq + 64 * c, xstride);
    _tile_loadd(4, b0[c], 64);
    _tile_loadd(5, b1[c], 64);
    _tile_loadd(3, xq + 64 * (c + 1), xstride);
    _tile_loadd(6, b0[c + 1], 64);
    _tile_loadd(7, b1[c + 1], 64);
    if constexpr (SIGNED_WEIGHTS) {
      _tile_dpbssd(0, 2, 4);
      _tile_dpbssd(1, 2, 5);
      _tile_dpbssd(0, 3, 6);
      _tile_dpbssd(1, 3, 7);
    } else {
      _tile_dpbsud(0, 2, 4);  // signed activations x unsigned weights
      _tile_dpbsud(1, 2, 5);
      _tile_dpbsud(0, 3, 6);
      _tile_dpbsud(1, 3, 7);
    }
  }
  _tile_stored(0, cbuf[0], 64);
  _tile_stored(1, cbuf[1], 64);
}

// One group of 16 Q4_K weight rows against `rows` activation rows from x
// (more than 16: padded with zero rows to whole tiles of 16): acc[m * 16 + c] += row m's
// products for m < rows, c < 16. Each block is unpacked once and every tile of rows passes
// it (a prompt's many tiles share the unpacking as the rows of one tile do).
// Row m's block b is x[m * row_step + b * block_step]; `half`: the last record is half
// (its pairs 2 and 3 are zero weights, taken as such by the tiles).
//
// Each 6-bit sub-block scale is split as sc = 8 hi + lo (hi, lo < 8), and the weights are
// multiplied by them as they are unpacked (hi q, lo q <= 105: still bytes), so that two
// sums over the whole block, C_hi = sum_k x_q hi q and C_lo = sum_k x_q lo q, give
// isum = 8 C_hi + C_lo = sum_j sc_j C_j exactly. Per block, a row then pays one shift
// and one add instead of a multiply per sub-block, and two tiles are stored instead of
// eight; the scale work moves to the unpacking, which every row of the tile shares.
void q4k_group_tiles(const uint8_t* w, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                     int64_t block_step, int rows, float* acc) {
  alignas(64) uint8_t bhi[4][16 * 64], blo[4][16 * 64];  // tiles: hi q, lo q per pair
  alignas(64) int32_t cbuf[2][TILE_ROWS * COLS];   // tiles: C_hi, C_lo
  const int ntiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
  const __m512i low4 = _mm512_set1_epi8(15), low3 = _mm512_set1_epi32(7);
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  for (int64_t b = 0; b < nb; ++b) {
    const int pairs = half && b == nb - 1 ? HALF_PAIRS : 4;
    RecordPrefetch ahead(w, RECORD);
    const Q4kScales<IntSum> s(w);
    const __m512i* sc = s.sc;
    // a column's 4 bytes share its scale: both 16-bit halves of its lane hold the factor,
    // and a 16-bit multiply of two bytes by it cannot carry (15 x 7 < 256)
    __m512i fhi[8], flo[8];
    for (int j = 0; j < 8; ++j) {
      const __m512i h = _mm512_srli_epi32(sc[j], 3), l = _mm512_and_si512(sc[j], low3);
      fhi[j] = _mm512_or_si512(h, _mm512_slli_epi32(h, 16));
      flo[j] = _mm512_or_si512(l, _mm512_slli_epi32(l, 16));
    }
    for (int p = 0; p < 4; ++p) {
      if (p >= pairs) {  // past a half record: zero weights
        std::memset(bhi[p], 0, sizeof(bhi[p]));
        std::memset(blo[p], 0, sizeof(blo[p]));
        continue;
      }
      for (int r = 0; r < 8; ++r) {
        if (r % 2 == 0) ahead.line();
        const __m512i v = _mm512_loadu_si512(w + OFF_Q + 512 * p + 64 * r);
        const __m512i q0 = _mm512_and_si512(v, low4);
        const __m512i q1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        _mm512_store_si512(bhi[p] + 64 * r, _mm512_mullo_epi16(q0, fhi[2 * p]));
        _mm512_store_si512(blo[p] + 64 * r, _mm512_mullo_epi16(q0, flo[2 * p]));
        _mm512_store_si512(bhi[p] + 64 * (8 + r), _mm512_mullo_epi16(q1, fhi[2 * p + 1]));
        _mm512_store_si512(blo[p] + 64 * (8 + r), _mm512_mullo_epi16(q1, flo[2 * p + 1]));
      }
    }
    for (int t = 0; t < ntiles; ++t) {
      const Q8Block* xt = x + t * TILE_ROWS * row_step;
      const uint8_t* xqt = reinterpret_cast<const uint8_t*>(xt + b * block_step) + offsetof(Q8Block, q);
      block_two_sums<false>(xqt, xstride, bhi, blo, cbuf);
      const int tile_rows = std::min(TILE_ROWS, rows - t * TILE_ROWS);
      for (int m = 0; m < tile_rows; ++m) {
        ahead.line();
        if (m % 2 == 0) ahead.line();
        // |C_hi|, |C_lo| <= 256 * 127 * 105: 8 C_hi + C_lo fits int32
        const __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cbuf[0] + COLS * m), 3),
                                              _mm512_load_si512(cbuf[1] + COLS * m));
        q4k_finish_row(_mm512_cvtepi32_ps(isum), s.mins, s.d, s.dmin, xt[m * row_step + b * block_step], acc + COLS * (t * TILE_ROWS + m));
      }
    }
    ahead.rest();
    w += pairs == 4 ? RECORD : half_record_bytes(TYPE_Q4_K);
  }
}

#endif

// 16 floats as bfloat16, rounded as c10::BFloat16(float) rounds (to nearest even; NaN ->
// 0x7FC0), bit for bit: one row's 16 outputs in a few instructions instead of 16 scalar
// conversions and strided stores (at 16 rows, the group's last step).
inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                        _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

// The 6-bit q (0..63) of Q6_K sub-blocks 2p and 2p + 1, row r of their VNNI layout: the
// low nibbles from QL, bits (2s, 2s + 1) of the quad byte moved to bits 4..5 (s = 2 (p % 2)
// (+ 1): << 4, << 2, >> 0, >> 2 for s = 0..3)
inline void q6k_unpack(const uint8_t* w, int p, int r, __m512i* qa, __m512i* qb) {
  const __m512i low4 = _mm512_set1_epi8(15), hi2 = _mm512_set1_epi8(0x30);
  const __m512i v = _mm512_loadu_si512(w + Q6_OFF_QL + 256 * p + 64 * r);
  const __m512i h = _mm512_loadu_si512(w + Q6_OFF_QH + 256 * (p / 2) + 64 * r);
  const bool first = p % 2 == 0;
  const __m512i ha = first ? _mm512_slli_epi16(h, 4) : h;
  const __m512i hb = first ? _mm512_slli_epi16(h, 2) : _mm512_srli_epi16(h, 2);
  *qa = _mm512_or_si512(_mm512_and_si512(v, low4), _mm512_and_si512(ha, hi2));
  *qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), _mm512_and_si512(hb, hi2));
}

// Q6_K weight sources, as Q4kRecord and Q4kUnpacked.
struct Q6kRecord {
  const uint8_t* w;
  void operator()(int p, int r, __m512i* qa, __m512i* qb) const { q6k_unpack(w, p, r, qa, qb); }
};
using Q6kUnpacked = UnpackedWeights<Q6kRecord, 8, 4>;

// One Q6_K block against R <= Q6kPath::PASS_ROWS rows, as q4k_block_vectors: sub-blocks
// 2p, 2p + 1 come out of one pass over their quad bytes, their C_j - 32 bsum_j in registers
// (the accumulators start at the row's -32 bsum_j, Q8Block::q6_offsets: a broadcast load,
// where a broadcast of 32 bsum_j and a subtraction per row and sub-block took 105 -> 63
// cycles a record and row at 16 rows from L2), and each row's isum += sc_j (C_j - 32 bsum_j)
// as they complete (Sum: in int32, the tiles' integer, or in float).
template <int R, typename Sum, typename Weights>
inline void q6k_block_vectors(const Weights& weights, const uint8_t* xq, int64_t xstride,
                              const typename Sum::Factor* sc, __m512 d, const Q8Block* xb, int64_t row_step,
                              float* acc, RecordPrefetch& ahead) {
  typename Sum::Vec isum[R];
  for (int m = 0; m < R; ++m) isum[m] = Sum::zero();
  for (int p = 0; p < 8; ++p) {
    __m512i c[R][2];  // C_j - 32 bsum_j: the offsets first
    for (int m = 0; m < R; ++m) {
      const Q8Block& x = xb[m * row_step];
      c[m][0] = _mm512_set1_epi32(x.q6_offsets[2 * p]);
      c[m][1] = _mm512_set1_epi32(x.q6_offsets[2 * p + 1]);
    }
    for (int r = 0; r < 4; ++r) {
      ahead.line();  // 53 lines over 32 steps
      if (r % 2 == 0) ahead.line();
      __m512i qa, qb;
      weights(p, r, &qa, &qb);
      rows_dpbusd<R>(xq + 32 * p + 4 * r, xstride, 16, qa, qb, c);
    }
    // |C_j - 32 bsum_j| <= 16 * 127 * 32 and |sc_j| <= 128: the sum over 16 fits int32
    for (int m = 0; m < R; ++m) {
      isum[m] = Sum::add(Sum::add(isum[m], c[m][0], sc[2 * p]), c[m][1], sc[2 * p + 1]);
    }
  }
  for (int m = 0; m < R; ++m) q6k_finish_row(Sum::to_float(isum[m]), d, xb[m * row_step], acc + COLS * m);
}

#if DRAFTSMAN_AMX
// 64 weights of one Q6_K sub-block (q in 0..63, 4 k of each column per 32-bit lane) times
// the column's scale, v = (q - 32) sc (|v| <= 4096, in 16 bits: scw holds the scale in both
// halves of the lane), as two byte operands v = 128 H + L (H = v >> 7 in [-32, 32],
// L = v & 127): the tiles then sum over a whole block at once, isum = 128 C_H + C_L, instead
// of one 16-k sub-block per tile multiply and a stored tile per sub-block.
inline void q6k_split_products(__m512i q, __m512i scw, __m512i* hb, __m512i* lb) {
  const __m512i qs = _mm512_sub_epi8(q, _mm512_set1_epi8(32));
  const __m512i e = _mm512_mullo_epi16(_mm512_srai_epi16(_mm512_slli_epi16(qs, 8), 8), scw);  // even bytes
  const __m512i o = _mm512_mullo_epi16(_mm512_srai_epi16(qs, 8), scw);                        // odd bytes
  const __m512i low7 = _mm512_set1_epi16(127), low8 = _mm512_set1_epi16(0xFF);
  *hb = _mm512_or_si512(_mm512_and_si512(_mm512_srai_epi16(e, 7), low8),
                        _mm512_slli_epi16(_mm512_srai_epi16(o, 7), 8));
  *lb = _mm512_or_si512(_mm512_and_si512(e, low7), _mm512_slli_epi16(_mm512_and_si512(o, low7), 8));
}

// One group of 16 Q6_K weight rows against more rows, on tiles, as q4k_group_tiles: each
// block's scaled weights are split once (q6k_split_products) and every tile of rows passes
// them, two tile sums per block.
void q6k_group_tiles(const uint8_t* w, const Q8Block* x, int64_t nb, bool /*half: never*/, int64_t row_step,
                     int64_t block_step, int rows, float* acc) {
  alignas(64) uint8_t bh[4][16 * 64], bl[4][16 * 64];  // tiles: H, L per 64 k
  alignas(64) int32_t cbuf[2][TILE_ROWS * COLS];      // tiles: C_H, C_L
  const int ntiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  for (int64_t b = 0; b < nb; ++b, w += Q6_RECORD) {
    RecordPrefetch ahead(w, Q6_RECORD);
    const Q6kScales<IntSum> s(w);
    __m512i scw[16];
    for (int j = 0; j < 16; ++j) scw[j] = _mm512_or_si512(_mm512_and_si512(s.sc[j], low16), _mm512_slli_epi32(s.sc[j], 16));
    for (int p = 0; p < 8; ++p) {
      for (int r = 0; r < 4; ++r) {
        ahead.line();
        __m512i qa, qb, h, l;
        q6k_unpack(w, p, r, &qa, &qb);
        // sub-block j's VNNI rows are rows 4 (j % 4) .. + 3 of the 64-k run j / 4
        q6k_split_products(qa, scw[2 * p], &h, &l);
        const int ra = 64 * (4 * ((2 * p) % 4) + r), rb = 64 * (4 * ((2 * p + 1) % 4) + r);
        _mm512_store_si512(bh[p / 2] + ra, h);
        _mm512_store_si512(bl[p / 2] + ra, l);
        q6k_split_products(qb, scw[2 * p + 1], &h, &l);
        _mm512_store_si512(bh[p / 2] + rb, h);
        _mm512_store_si512(bl[p / 2] + rb, l);
      }
    }
    for (int t = 0; t < ntiles; ++t) {
      const Q8Block* xt = x + t * TILE_ROWS * row_step;
      const uint8_t* xqt = reinterpret_cast<const uint8_t*>(xt + b * block_step) + offsetof(Q8Block, q);
      block_two_sums<true>(xqt, xstride, bh, bl, cbuf);
      const int tile_rows = std::min(TILE_ROWS, rows - t * TILE_ROWS);
      for (int m = 0; m < tile_rows; ++m) {
        ahead.line();
        ahead.line();
        // |C_H| <= 256 * 127 * 32: 128 C_H + C_L fits int32 and is the vector path's isum
        const __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cbuf[0] + COLS * m), 7),
                                              _mm512_load_si512(cbuf[1] + COLS * m));
        q6k_finish_row(_mm512_cvtepi32_ps(isum), s.d, xt[m * row_step + b * block_step], acc + COLS * (t * TILE_ROWS + m));
      }
    }
    ahead.rest();
  }
}

#endif

// A block type's pieces for the group loops below: its record size, per-column factors,
// weight sources and block step on vectors (their sums added up by Sum), and (AMX) its tile
// path.


template <typename Sum>
struct Q4kPath {
  static constexpr int BYTES = RECORD, HALF_BYTES = half_record_bytes(TYPE_Q4_K);
  // rows in registers at once: 8 (16 sums + 8 totals + 2 weight vectors of 32 zmm). From
  // memory, one 8960 x 1536 matrix at 6 / 8 rows 0.46 / 0.48 -> 0.38 / 0.43 ms against
  // passes of at most 5 (float sums)
  static constexpr int PASS_ROWS = 8;
  using Scales = Q4kScales<Sum>;
  using Record = Q4kRecord<Sum>;
  using Unpacked = Q4kUnpacked<Sum>;
  template <int R, int PAIRS, typename Weights>
  static void block(const Weights& weights, const Scales& s, const Q8Block* xb, int64_t xstride,
                    int64_t row_step, float* acc, RecordPrefetch& ahead) {
    q4k_block_vectors<R, Sum, PAIRS>(weights, quants(xb), xstride, s.sc, s.mins, s.d, s.dmin, xb, row_step, acc, ahead);
  }
#if DRAFTSMAN_AMX
  static constexpr auto tiles = q4k_group_tiles;
#endif
};

template <typename Sum>
struct Q6kPath {
  static constexpr int BYTES = Q6_RECORD, HALF_BYTES = 0;  // no half records
  // 5: 8 rows as two passes of 4 over weights unpacked once beat one pass of 8 unpacking in
  // registers (q6k_unpack's ~10 operations a vector): 583 vs 773 cycles a record from L2; at
  // 16 rows 4 passes of 4 and 2 of 8 are level (1013 / 1023)
  static constexpr int PASS_ROWS = 5;
  using Scales = Q6kScales<Sum>;
  using Record = Q6kRecord;
  using Unpacked = Q6kUnpacked;
  template <int R, int PAIRS, typename Weights>
  static void block(const Weights& weights, const Scales& s, const Q8Block* xb, int64_t xstride,
                    int64_t row_step, float* acc, RecordPrefetch& ahead) {
    static_assert(PAIRS == 4, "Q6_K records are never half");
    q6k_block_vectors<R, Sum>(weights, quants(xb), xstride, s.sc, s.d, xb, row_step, acc, ahead);
  }
#if DRAFTSMAN_AMX
  static constexpr auto tiles = q6k_group_tiles;
#endif
};

// The 8-bit records (q8_records.h) on vectors (their tiles: byte_tiles.h): Q8_0 blocks (Scales = Q8Scales, one float16
// scale per 32 folded per block) and int8 rows (I8Scales, one integer per record and row).
// Q8_0: 8 rows in registers (two accumulators each, 2 weight vectors); int8 rows: 16 (one
// accumulator each past 8); more take passes over the record in L1, which has nothing to
// unpack.
template <typename S>
struct BytePath {
  static constexpr int BYTES = record_bytes(S::QTYPE), HALF_BYTES = half_record_bytes(S::QTYPE);
  static constexpr int PASS_ROWS = S::QTYPE == TYPE_I8_ROW ? 16 : 8;
  using Scales = S;
  using Record = ByteRecord<S::WEIGHTS>;
  using Unpacked = ByteUnpacked<S::WEIGHTS>;
  template <int R, int PAIRS, typename Weights>
  static void block(const Weights& weights, const Scales& s, const Q8Block* xb, int64_t xstride,
                    int64_t row_step, float* acc, RecordPrefetch& ahead) {
    byte_block_vectors<R, PAIRS>(weights, quants(xb), xstride, s, xb, row_step, acc, ahead);  // by S
  }
};

// P's block step for record b of a group of nb (`half`: the last is a half record, P::HALF_BYTES
// long), prefetching ahead of it; returns the record's bytes. f(PAIRS) runs the step. `then`:
// the first record of the group worked next (the next one in memory, or a SwiGLU unit's other
// half), where the prefetch goes on past this group's last record.
template <typename P, typename F>
inline int64_t record_step(const uint8_t* w, int64_t b, int64_t nb, bool half, const uint8_t* then, F&& f) {
  const int64_t past = b + RecordPrefetch::AHEAD - nb;  // records into the next group
  RecordPrefetch ahead = past >= 0 ? RecordPrefetch::at(then + past * P::BYTES, P::BYTES) : RecordPrefetch(w, P::BYTES);
  if constexpr (P::HALF_BYTES > 0) {
    if (half && b == nb - 1) {
      f(std::integral_constant<int, HALF_PAIRS>{}, ahead);
      ahead.rest();
      return P::HALF_BYTES;
    }
  }
  f(std::integral_constant<int, 4>{}, ahead);
  ahead.rest();
  return P::BYTES;
}

// One group of 16 weight rows against R <= P::PASS_ROWS activation rows on vectors, the
// weights unpacked in registers as they are used: one function per R, so that each gets its
// own registers. Row m's block b is x[m * row_step + b * block_step].
template <typename P, int R>
void group_vectors(const uint8_t* w, const uint8_t* then, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                   int64_t block_step, float* acc) {
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  for (int64_t b = 0; b < nb; ++b) {
    w += record_step<P>(w, b, nb, half, then, [&](auto pairs, RecordPrefetch& ahead) {
      const typename P::Scales s(w);
      P::template block<R, decltype(pairs)::value>(typename P::Record{w}, s, x + b * block_step, xstride,
                                                   row_step, acc, ahead);
    });
  }
}

// The same against any number of rows, in passes of vector_pass_rows(rows) per block over its
// weights unpacked once into L1.
template <typename P>
void group_passes(const uint8_t* w, const uint8_t* then, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                  int64_t block_step, int rows, float* acc) {
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  const int pass = vector_pass_rows(rows, P::PASS_ROWS);
  alignas(64) uint8_t bytes[P::Unpacked::BYTES];
  typename P::Unpacked unpacked{bytes};
  for (int64_t b = 0; b < nb; ++b) {
    w += record_step<P>(w, b, nb, half, then, [&](auto pairs, RecordPrefetch& ahead) {
      constexpr int PAIRS = decltype(pairs)::value;
      const typename P::Scales s(w);
      unpacked.unpack(w, PAIRS != 4);
      for (int m0 = 0; m0 < rows; m0 += pass) {
        const Q8Block* xb = x + b * block_step + m0 * row_step;
        with_vector_rows<P::PASS_ROWS>(std::min(pass, rows - m0), [&](auto r) {
          P::template block<decltype(r)::value, PAIRS>(unpacked, s, xb, xstride, row_step, acc + COLS * m0, ahead);
        });
      }
    });
  }
}

// One group of 16 weight rows against `rows` activation rows on vectors, in one pass or
// several; `then` as record_step's.
template <typename P>
void group_on_vectors(const uint8_t* w, const uint8_t* then, const Q8Block* x, int64_t nb, bool half,
                      int64_t row_step, int64_t block_step, int rows, float* acc) {
  if (rows > P::PASS_ROWS) return group_passes<P>(w, then, x, nb, half, row_step, block_step, rows, acc);
  with_vector_rows<P::PASS_ROWS>(rows, [&](auto r) {
    group_vectors<P, decltype(r)::value>(w, then, x, nb, half, row_step, block_step, acc);
  });
}

// The same on tiles where the model takes them (AMX, from tile_rows > 0 rows), and there its
// fewer rows' vectors add up in int32 as the tiles do (IntSum), so that a row's bits do not
// depend on how many rows share the call; without tiles, in float (FloatSum, fewer uops).
// `then` as record_step's (the tiles prefetch on in memory order).
template <template <typename> class P>
void group(const uint8_t* w, const uint8_t* then, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
           int64_t block_step, int rows, int64_t tile_rows, float* acc) {
#if DRAFTSMAN_AMX
  if (tile_rows > 0) {
    if (rows >= tile_rows) return P<IntSum>::tiles(w, x, nb, half, row_step, block_step, rows, acc);
    return group_on_vectors<P<IntSum>>(w, then, x, nb, half, row_step, block_step, rows, acc);
  }
#endif
  (void)tile_rows;
  group_on_vectors<P<FloatSum>>(w, then, x, nb, half, row_step, block_step, rows, acc);
}

// 8-bit records (Q8_0 blocks, int8 rows): on tiles where the caller asks (AMX, enough rows),
// else on vectors; the same bits.
inline void byte_group(int64_t qtype, const uint8_t* w, const uint8_t* then, const Q8Block* x, int64_t nb,
                       bool half, int64_t row_step, int64_t block_step, int rows, bool tiles, float* acc) {
  const bool q8_0 = qtype == TYPE_Q8_0;
#if DRAFTSMAN_AMX
  if (tiles && q8_0) return byte_group_tiles<Q8Tiles>(w, x, nb, half, row_step, block_step, rows, acc);
  if (tiles) return byte_group_tiles<I8Tiles>(w, x, nb, half, row_step, block_step, rows, acc);
#endif
  (void)tiles;
  if (q8_0) return group_on_vectors<BytePath<Q8Scales>>(w, then, x, nb, half, row_step, block_step, rows, acc);
  group_on_vectors<BytePath<I8Scales>>(w, then, x, nb, half, row_step, block_step, rows, acc);
}

// Two groups of 16 Q4_K weight rows (records wa, wb) against `rows` activation rows on
// vectors, in passes of at most PAIR_ROWS rows over each pair of blocks; their sums to acca,
// accb (16 a row). The last record is half where `half` says.
template <typename Sum>
void q4k_pair_groups(const uint8_t* wa, const uint8_t* wb, int64_t next_unit, const Q8Block* x, int64_t nb,
                     bool half, int64_t row_step, int64_t block_step, int rows, float* acca, float* accb) {
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  const int pass = vector_pass_rows(rows, PAIR_ROWS);
  const int64_t to_b = wb - wa;
  for (int64_t b = 0; b < nb; ++b) {
    const bool last_half = half && b == nb - 1;
    const uint8_t* ahead = pair_ahead(wa, b, nb, next_unit, RECORD);
    RecordPrefetch aheada = RecordPrefetch::at(ahead, RECORD), aheadb = RecordPrefetch::at(ahead + to_b, RECORD);
    const Q4kScales<Sum> sa(wa), sb(wb);
    for (int m0 = 0; m0 < rows; m0 += pass) {
      const Q8Block* xb = x + b * block_step + m0 * row_step;
      with_vector_rows<PAIR_ROWS>(std::min(pass, rows - m0), [&](auto r) {
        constexpr int R = decltype(r)::value;
        float *a = acca + COLS * m0, *c = accb + COLS * m0;
        if (last_half) {
          q4k_block_pair<R, Sum, 2 * HALF_PAIRS>(wa, wb, sa, sb, quants(xb), xstride, xb, row_step, a, c, aheada, aheadb);
        } else {
          q4k_block_pair<R, Sum, 8>(wa, wb, sa, sb, quants(xb), xstride, xb, row_step, a, c, aheada, aheadb);
        }
      });
    }
    aheada.rest();
    aheadb.rest();
    const int bytes = last_half ? half_record_bytes(TYPE_Q4_K) : RECORD;
    wa += bytes;
    wb += bytes;
  }
}

// The same for Q6_K, each pair of blocks unpacked once into L1 for every pass.
template <typename Sum>
void q6k_pair_groups(const uint8_t* wa, const uint8_t* wb, int64_t next_unit, const Q8Block* x, int64_t nb,
                     int64_t row_step, int64_t block_step, int rows, float* acca, float* accb) {
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  const int pass = vector_pass_rows(rows, PAIR_ROWS);
  alignas(64) uint8_t bytesa[Q6kUnpacked::BYTES], bytesb[Q6kUnpacked::BYTES];
  Q6kUnpacked ua{bytesa}, ub{bytesb};
  const int64_t to_b = wb - wa;
  for (int64_t b = 0; b < nb; ++b, wa += Q6_RECORD, wb += Q6_RECORD) {
    const uint8_t* ahead = pair_ahead(wa, b, nb, next_unit, Q6_RECORD);
    RecordPrefetch aheada = RecordPrefetch::at(ahead, Q6_RECORD),
                   aheadb = RecordPrefetch::at(ahead + to_b, Q6_RECORD);
    const Q6kScales<Sum> sa(wa), sb(wb);
    ua.unpack(wa, false);
    ub.unpack(wb, false);
    for (int m0 = 0; m0 < rows; m0 += pass) {
      const Q8Block* xb = x + b * block_step + m0 * row_step;
      with_vector_rows<PAIR_ROWS>(std::min(pass, rows - m0), [&](auto r) {
        q6k_block_pair<decltype(r)::value, Sum>(bytesa, bytesb, sa, sb, quants(xb), xstride, xb, row_step,
                                                acca + COLS * m0, accb + COLS * m0, aheada, aheadb);
      });
    }
    aheada.rest();
    aheadb.rest();
  }
}
#endif

// Whether a call's groups go two at a time (kquant_records_pairs.h): Q4_K and Q6_K on
// vectors (not where the tiles take the rows), from as many rows as pairing measured faster
// in whole forwards (the 1.5B q4 after 256 tokens, the two builds alternated on a Zen 5
// EPYC: 16 rows 59.0 -> 51.1 ms, 12 rows 45.8 -> 40.9; once pairs prefetched in their order
// of work, 8 rows 27.9-30.6 -> 26.2-27.9 and 6 rows 24.4-26.1 -> 22.2-22.8, the 0.5B's
// level). Below 6 rows the single groups stay ahead (5 rows 19.7-20.3 against 20.5-21.3, 4
// rows 18.1-23.3 against 20.0-29.1): while the rows are few a step is bound by the weight
// stream, and two groups' records streamed at once come in slower than one group's.
constexpr int PAIR_FROM_ROWS = 6;
inline bool pair_groups(int64_t qtype, int64_t rows, bool tiles) {
  return DRAFTSMAN_RECORDS && (qtype == TYPE_Q4_K || qtype == TYPE_Q6_K) && rows >= PAIR_FROM_ROWS && !tiles;
}

#if DRAFTSMAN_RECORDS
// Whether a call's activation blocks lie block-major (row m's block b at b * tiled + m):
// past one tile of rows (below), and for int8 rows from I8_ONE_SUM_ROWS (i8_many_rows needs
// every row's block at a constant offset from the first's).
inline bool rows_by_block(int64_t qtype, int64_t tiled) {
  return tiled > TILE_ROWS || (qtype == TYPE_I8_ROW && tiled >= I8_ONE_SUM_ROWS);
}

// Where a unit of work's groups lie in a packed matrix: the first group's records at `a`, the
// second's (count 2) at `b`, the next unit's first group `next` bytes past `a` (a pair's
// prefetch runs on into it). A plain product's unit: consecutive groups (`consecutive`); a
// SwiGLU unit: gate group g and up group g, half the matrix apart, the next unit one group on.
struct Unit {
  const uint8_t* a;
  const uint8_t* b;
  int64_t next;
  int count;

  static Unit consecutive(const uint8_t* w, int64_t group_bytes, int count) {
    return {w, w + group_bytes, count * group_bytes, count};
  }
  // one group at w, the work going on at `then`
  static Unit single(const uint8_t* w, const uint8_t* then) { return {w, nullptr, then - w, 1}; }
};

// The sums of a unit's groups against `rows` activation rows, group i's to acc + i * acc_step;
// two go together where pair_groups says. tile_rows as kquant_records_into's; tiles: whether
// this call's rows take them.
void groups_product(int64_t qtype, const Unit& u, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                    int64_t block_step, int rows, int64_t tile_rows, bool tiles, float* acc, int64_t acc_step) {
  if (u.count == 2 && pair_groups(qtype, rows, tiles)) {
    // a model with tiles adds up its vector rows in int32 as the tiles do (see `group`)
    const bool int_sums = tile_rows > 0;
    float* accb = acc + acc_step;
    if (qtype == TYPE_Q4_K) {
      if (int_sums) return q4k_pair_groups<IntSum>(u.a, u.b, u.next, x, nb, half, row_step, block_step, rows, acc, accb);
      return q4k_pair_groups<FloatSum>(u.a, u.b, u.next, x, nb, half, row_step, block_step, rows, acc, accb);
    }
    if (int_sums) return q6k_pair_groups<IntSum>(u.a, u.b, u.next, x, nb, row_step, block_step, rows, acc, accb);
    return q6k_pair_groups<FloatSum>(u.a, u.b, u.next, x, nb, row_step, block_step, rows, acc, accb);
  }
  for (int i = 0; i < u.count; ++i, acc += acc_step) {
    // in the order of work: a, then b (where there is one), then the next unit's a
    const uint8_t* w = i == 0 ? u.a : u.b;
    const uint8_t* then = i == 0 && u.count == 2 ? u.b : u.a + u.next;
    if (qtype == TYPE_Q4_K) {
      group<Q4kPath>(w, then, x, nb, half, row_step, block_step, rows, tile_rows, acc);
    } else if (qtype == TYPE_Q8_0 || qtype == TYPE_I8_ROW) {
      byte_group(qtype, w, then, x, nb, half, row_step, block_step, rows, tiles, acc);
    } else {
      group<Q6kPath>(w, then, x, nb, half, row_step, block_step, rows, tile_rows, acc);
    }
  }
}
#endif

bool amx_available() {
#if DRAFTSMAN_AMX
  return amx_permitted();
#else
  return false;
#endif
}

// Whether Q4_K and Q6_K records run here: AVX-512 VNNI (gguf_matmul_records.cpp) or AVX2
// alone (kquant_records_avx2.h).
bool records_available() { return DRAFTSMAN_RECORDS != 0 || DRAFTSMAN_RECORDS_AVX2 != 0; }

// Whether the 8-bit records (Q8_0 blocks, int8 rows) run here: AVX-512 VNNI only (AVX2's
// vpmaddubsw would saturate on their unsigned bytes x activations).
bool byte_records_available() { return DRAFTSMAN_RECORDS != 0; }

// Row r's n <= 16 sums of one group into y (floats, or bf16 rounded once as c10 rounds)
inline void store_row(const float* acc, int cols, float* yf, c10::BFloat16* yb) {
  for (int c = 0; c < cols; ++c) {
    if (yb) {
      yb[c] = c10::BFloat16(acc[c]);
    } else {
      yf[c] = acc[c];
    }
  }
}

#if DRAFTSMAN_RECORDS
// Gate groups (and their up groups) a SwiGLU unit takes at most where they do not pair (else
// a thread's share): each half's run read as one stream before the other's. Group by group,
// the stream jumped between the halves every 14 KB (the 1.5B's groups), and one row read
// ~2-4% slower than the plain product and silu_mul after it (a Zen 5 EPYC).
constexpr int64_t SWIGLU_RUN = 64;

// The run for `half_groups` gate groups over `threads`: at most SWIGLU_RUN, and as many runs
// as a multiple of the threads, so that each thread gets as many groups (560 at one row of the
// 1.5B on 2 threads: runs of 64 made 9 units, split 5 and 4, ~4% slower than the plain
// product; runs of 56 make 10).
inline int64_t swiglu_run(int64_t half_groups, int64_t threads) {
  const int64_t per_thread = (half_groups + threads - 1) / threads;
  const int64_t units = threads * ((per_thread + SWIGLU_RUN - 1) / SWIGLU_RUN);
  return (half_groups + units - 1) / units;
}

// The sums of a SwiGLU unit: `count` gate groups at `gate` and their up groups at `up`, gate
// group i's to acc + i * acc_step and its up group's to acc + (count + i) * acc_step. Paired
// (count 1): block b of both at once; else the gate run, then the up run, each prefetching
// on into the next in the order of work.
void swiglu_sums(int64_t qtype, const uint8_t* gate, const uint8_t* up, int count, int64_t group_bytes, bool paired,
                 const Q8Block* x, int64_t nb, bool half, int64_t row_step, int64_t block_step, int rows,
                 int64_t tile_rows, bool tiles, float* acc, int64_t acc_step) {
  if (paired) {
    return groups_product(qtype, Unit{gate, up, group_bytes, 2}, x, nb, half, row_step, block_step, rows, tile_rows,
                          tiles, acc, acc_step);
  }
  for (int i = 0; i < 2 * count; ++i) {
    const uint8_t* w = i < count ? gate + i * group_bytes : up + (i - count) * group_bytes;
    const uint8_t* then = i == count - 1 ? up : i == 2 * count - 1 ? gate + count * group_bytes : w + group_bytes;
    groups_product(qtype, Unit::single(w, then), x, nb, half, row_step, block_step, rows, tile_rows, tiles,
                   acc + i * acc_step, acc_step);
  }
}

// Rows 0..m-1 of a SwiGLU unit's 16 columns: y = silu(gate) * up from the gate group's sums
// and the up group's, each first rounded to y's dtype as the plain product stores it, then
// silu_mul_span's step: the bits silu_mul computes from kquant_records_mm's output. bf16: the
// sums rounded in registers (round16 gives to_bf16's value for every sum that is not NaN)
// instead of stored as bf16 and loaded back.
inline void store_swiglu(const float* gate, const float* up, int64_t m, float* yf, c10::BFloat16* yb,
                         int64_t ldy) {
  for (int64_t r = 0; r < m; ++r) {
    const float *g = gate + COLS * r, *u = up + COLS * r;
    if (yb) {
      const __m512 gv = draftsman_simd::round16(_mm512_load_ps(g), yb);
      const __m512 uv = draftsman_simd::round16(_mm512_load_ps(u), yb);
      draftsman_simd::store16(yb + r * ldy, draftsman_simd::silu_mul16(gv, uv, yb));
    } else {
      draftsman_simd::silu_mul_span(g, u, COLS, yf + r * ldy);
    }
  }
}

// The greedy op's step after a unit's products: `count` groups' sums (from group g0; columns
// past n ignored) go by each row's lanes as the values the plain product would store (bf16:
// rounded as to_bf16 rounds, a NaN staying a NaN)
inline void pick_groups(const float* acc, int64_t acc_step, int count, int64_t g0, int64_t n, int64_t m, bool bf16,
                        draftsman_greedy::Lanes* lanes) {
  const __m512 none = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int i = 0; i < count; ++i) {
    const int64_t g = g0 + i;
    const int cols = static_cast<int>(std::min<int64_t>(COLS, n - g * COLS));
    const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1);
    const __m512i index = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(g * COLS)),
                                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    for (int64_t r = 0; r < m; ++r) {
      __m512 v = _mm512_load_ps(acc + i * acc_step + COLS * r);
      if (bf16) {
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        v = _mm512_mask_mov_ps(draftsman_simd::round16(v, static_cast<const c10::BFloat16*>(nullptr)), nan, v);
      }
      lanes[r].take(_mm512_mask_mov_ps(none, keep, v), index);
    }
  }
}
#endif

// x's `rows` rows quantised into xdata (quantize_part), then work(begin, end) over
// [0, units) split as at::parallel_for splits it. A call whose rows hold FUSED_FROM_BLOCKS
// blocks or more does both in one parallel region: each thread quantises a share of the
// blocks of every row (of the rows where a row has fewer blocks than there are threads), and
// after a barrier works its units. Quantised on the calling thread alone (or in a region of
// its own, quantize_rows_into), a 16-row verify's activations kept the other thread waiting,
// and then reached it from the calling core's cache (the 0.5B q8: 56 blocks a call, ~4.6 us
// quantising and ~3.4 us of the other thread's first reads, 97 calls a forward). Shares of
// blocks rather than rows: a down projection's input is the gate/up call's output, whose
// columns each thread wrote in halves, so each thread now reads what it wrote (the 1.5B q4,
// 8 rows: ~0.6 ms a forward, bench-results/profile-zen5-floor). A block is the same whoever
// quantises it.
constexpr int64_t FUSED_FROM_BLOCKS = 32;

// The fewest rows a slice of a many-row call takes (kquant_records_into): 4 tiles, so that each
// unpacked block still serves many rows.
constexpr int64_t SLICE_MIN_ROWS = 4 * TILE_ROWS;

template <typename F>
void quantize_then_work(const at::Tensor& x, int64_t rows, int64_t nb, bool by_block, Q8Block* xdata, int64_t units,
                        const F& work) {
  const int threads = at::get_num_threads();
  if (threads < 2 || units < threads || rows < threads || rows * nb < FUSED_FROM_BLOCKS || at::in_parallel_region()) {
    quantize_rows_into(x, rows, nb, by_block, xdata);
    at::parallel_for(0, units, 1, work);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    if (nb >= n) {
      const int64_t share = (nb + n - 1) / n, b0 = std::min(nb, t * share);
      quantize_part(x, 0, rows, b0, std::min(nb, b0 + share), rows, nb, by_block, xdata);
    } else {
      const int64_t share = (rows + n - 1) / n, r0 = std::min(rows, t * share);
      quantize_row_range(x, r0, std::min(rows, r0 + share), rows, nb, by_block, xdata);
    }
#pragma omp barrier
    const int64_t unit_share = (units + n - 1) / n, u0 = t * unit_share;
    if (u0 < units) work(u0, std::min(units, u0 + unit_share));
  }
}

// One call of kquant_records_into over all of x's rows (see there).
void records_rows_into(const at::Tensor& x, const at::Tensor& packed, int64_t qtype, int64_t n,
                       int64_t tile_rows, at::Tensor& y, int64_t col, bool swiglu, int64_t* tokens) {
  TORCH_CHECK(records_available(), "kquant_records_mm: this build or CPU has neither AVX-512 VNNI nor AVX2");
  TORCH_CHECK(tile_rows >= 0, "kquant_records_mm: tile_rows must be 0 (no tiles) or a row count");
  TORCH_CHECK(tile_rows == 0 || amx_available(), "kquant_records_mm: this build or CPU has no AMX-INT8 tiles");
  TORCH_CHECK(qtype == TYPE_Q4_K || qtype == TYPE_Q6_K || qtype == TYPE_Q8_0 || qtype == TYPE_I8_ROW,
              draftsman_msg::text("kquant_records_mm: qtype must be Q4_K, Q6_K, Q8_0 or int8 rows (", TYPE_I8_ROW, ")"));
  TORCH_CHECK(qtype == TYPE_Q4_K || qtype == TYPE_Q6_K || byte_records_available(),
              "kquant_records_mm: 8-bit records need AVX-512 VNNI; this build has the AVX2 K-quant records only");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(x.dim() == 2 && (bf16 || x.scalar_type() == at::kFloat) && x.is_contiguous(),
              "kquant_records_mm: x must be a contiguous float32 or bfloat16 [M, K] tensor");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "kquant_records_mm: packed must come from kquant_pack_records");
  const int64_t m = x.size(0), k = x.size(1), groups = packed.size(0);
  // K from the weights: x may be narrower than their 256-multiple width (zero-padded weights);
  // a group that is not whole records ends in a half record (kquant_records.h)
  const int rec_bytes = record_bytes(qtype), half_bytes = half_record_bytes(qtype);
  const bool half = packed.size(1) % rec_bytes != 0;
  const int64_t nb = packed.size(1) / rec_bytes + (half ? 1 : 0);
  TORCH_CHECK(packed.size(1) == (nb - 1) * rec_bytes + (half ? half_bytes : rec_bytes) &&
                  k <= (nb - 1) * QK + (half ? HALF_K : QK) && k > (nb - 1) * QK &&
                  n > (groups - 1) * COLS && n <= groups * COLS,
              draftsman_msg::text("kquant_records_mm: packed holds ", groups, " groups of ", packed.size(1),
                                  " bytes, not ", n, " rows of width ", k));
  TORCH_CHECK(!swiglu || DRAFTSMAN_RECORDS,
              "kquant_records_swiglu: needs the AVX-512 VNNI records; this build has the AVX2 records only "
              "(run silu_mul on kquant_records_mm's output)");
  TORCH_CHECK(!swiglu || (n % (2 * COLS) == 0 && groups % 2 == 0),
              draftsman_msg::text("kquant_records_swiglu: the gate and up halves must be whole groups of ", COLS,
                                  " rows (n a multiple of ", 2 * COLS, "), not n = ", n));
  const int64_t y_cols = swiglu ? n / 2 : n;
  TORCH_CHECK(tokens || y.dim() == 2 && y.size(0) == m && y.scalar_type() == x.scalar_type() && y.stride(1) == 1 &&
                  y.stride(0) == y.size(1) && col >= 0 && col + y_cols <= y.size(1),
              "kquant_records_mm: out must be a contiguous [M, >= col + n] tensor in x's dtype");
  if (m == 0) return;  // no rows: nothing to read (the vector paths take at least one)
  TORCH_CHECK(!tokens || DRAFTSMAN_RECORDS, "kquant_records_greedy: needs the AVX-512 VNNI records");
  const int64_t ldy = tokens ? 0 : y.size(1);
#if DRAFTSMAN_RECORDS
  // more rows than a tile: padded with zero rows to whole tiles, all configured 16 high
  const bool tiles = tile_rows > 0 && m >= tile_rows;
  const int64_t tiled = m > TILE_ROWS ? (m + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS : m;
  [[maybe_unused]] const int tile_height = static_cast<int>(std::min<int64_t>(m, TILE_ROWS));
  // Many tiles: blocks laid out block-major (row m's block b at b * tiled + m), so that the
  // rows every tile reads for one block are one contiguous run the prefetcher follows;
  // row-major, a prompt's rows of a wide matrix (35 blocks of 292 bytes each) were hundreds
  // of strided streams, slower than unpacking each block once per tile.
  const bool by_block = rows_by_block(qtype, tiled);
  thread_local std::vector<Q8Block> xs;  // grows only: no allocation or page faults per call
  if (static_cast<int64_t>(xs.size()) < tiled * nb) xs.resize(static_cast<size_t>(tiled * nb));
  Q8Block* xdata = xs.data();  // a lambda's `xs` would be its own thread's
  const int64_t row_step = by_block ? 1 : nb, block_step = by_block ? tiled : 1;
  float* yf = bf16 || tokens ? nullptr : y.data_ptr<float>() + col;
  c10::BFloat16* yb = bf16 && !tokens ? y.data_ptr<c10::BFloat16>() + col : nullptr;
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  // greedy: each call of `work` picks over its units' columns, then merges into `picks`
  std::vector<draftsman_greedy::Pick> picks(tokens ? static_cast<size_t>(m) : 0);
  std::mutex merging;
  // Each unit of one or two groups of 16 output columns (pair_groups; SwiGLU: a gate group and
  // its up group) is one thread's work: every tile of activation rows passes each of its
  // blocks as it is unpacked.
  const bool paired = pair_groups(qtype, m, tiles);
  // SwiGLU units: one gate group and its up group where they pair, else runs of SWIGLU_RUN
  const int64_t half_groups = groups / 2, run = swiglu && !paired ? swiglu_run(half_groups, at::get_num_threads()) : 1;
  const int per_unit = swiglu ? static_cast<int>(2 * run) : paired ? 2 : 1;
  const int64_t units = swiglu ? (half_groups + run - 1) / run : (groups + per_unit - 1) / per_unit;
  const int64_t acc_step = tiled * COLS, group_bytes = packed.size(1);
  const auto work = [&](int64_t begin, int64_t end) {
#if DRAFTSMAN_AMX
    if (tiles) configure_tiles(tile_height, qtype == TYPE_Q8_0 ? Q8Tiles::DEPTH : 64);
#endif
    thread_local std::vector<float> buf;  // grows only, as xs; rows 64-byte aligned
    const int64_t floats = per_unit * acc_step + COLS;
    if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
    float* acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
    thread_local std::vector<draftsman_greedy::Lanes> lanes;
    if (tokens) {
      if (static_cast<int64_t>(lanes.size()) < m) lanes.resize(static_cast<size_t>(m));
      for (int64_t r = 0; r < m; ++r) lanes[r].start(begin * per_unit * COLS);
    }
    for (int64_t u = begin; u < end; ++u) {
      if (swiglu) {
        const int64_t g0 = u * run;
        const uint8_t* gate = wp + g0 * group_bytes;
        const int count = static_cast<int>(std::min(run, half_groups - g0));
        std::fill(acc, acc + 2 * count * acc_step, 0.f);
        swiglu_sums(qtype, gate, gate + half_groups * group_bytes, count, group_bytes, paired, xdata, nb, half,
                    row_step, block_step, static_cast<int>(m), tile_rows, tiles, acc, acc_step);
        for (int i = 0; i < count; ++i) {
          const int64_t at = (g0 + i) * COLS;
          store_swiglu(acc + i * acc_step, acc + (count + i) * acc_step, m, yf ? yf + at : nullptr,
                       yb ? yb + at : nullptr, ldy);
        }
        continue;
      }
      const int64_t g0 = u * per_unit;
      const int count = static_cast<int>(std::min<int64_t>(per_unit, groups - g0));
      std::fill(acc, acc + count * acc_step, 0.f);
      groups_product(qtype, Unit::consecutive(wp + g0 * group_bytes, group_bytes, count), xdata, nb, half, row_step,
                     block_step, static_cast<int>(m), tile_rows, tiles, acc, acc_step);
      if (tokens) {
        pick_groups(acc, acc_step, count, g0, n, m, bf16, lanes.data());
        continue;
      }
      for (int i = 0; i < count; ++i) {
        const int64_t g = g0 + i;
        const int cols = static_cast<int>(std::min<int64_t>(COLS, n - g * COLS));
        const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1);
        for (int64_t r = 0; r < m; ++r) {
          const __m512 v = _mm512_load_ps(acc + i * acc_step + COLS * r);
          if (bf16) {
            _mm256_mask_storeu_epi16(yb + r * ldy + g * COLS, keep, to_bf16(v));
          } else {
            _mm512_mask_storeu_ps(yf + r * ldy + g * COLS, keep, v);
          }
        }
      }
    }
#if DRAFTSMAN_AMX
    if (tiles) _tile_release();
#endif
    if (tokens) {
      std::lock_guard<std::mutex> hold(merging);
      for (int64_t r = 0; r < m; ++r) picks[r].merge(lanes[r].pick());
    }
  };
  quantize_then_work(x, tiled, nb, by_block, xdata, units, work);
  for (int64_t r = 0; r < static_cast<int64_t>(picks.size()); ++r) tokens[r] = picks[r].token();
#elif DRAFTSMAN_RECORDS_AVX2
  // the same work split and activation layout as above, on AVX2 vectors (no tiles)
  (void)tile_rows;
  const bool by_block = m > TILE_ROWS;
  thread_local std::vector<Q8Block> xs;
  quantize_rows_into(x, m, nb, by_block, xs);
  const Q8Block* xdata = xs.data();
  const int64_t row_step = by_block ? 1 : nb, block_step = by_block ? m : 1;
  float* yf = bf16 ? nullptr : y.data_ptr<float>() + col;
  c10::BFloat16* yb = bf16 ? y.data_ptr<c10::BFloat16>() + col : nullptr;
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> acc;
    if (static_cast<int64_t>(acc.size()) < m * COLS) acc.resize(static_cast<size_t>(m * COLS));
    for (int64_t g = begin; g < end; ++g) {
      const int cols = static_cast<int>(std::min<int64_t>(COLS, n - g * COLS));
      std::fill(acc.begin(), acc.begin() + m * COLS, 0.f);
      draftsman_avx2_records::group(wp + g * packed.size(1), qtype, xdata, nb, half, row_step, block_step,
                                    static_cast<int>(m), acc.data());
      for (int64_t r = 0; r < m; ++r) {
        store_row(acc.data() + COLS * r, cols, yf ? yf + r * ldy + g * COLS : nullptr,
                  yb ? yb + r * ldy + g * COLS : nullptr);
      }
    }
  });
#endif
}

// Half a core's L2 (1 MiB where the OS does not say): what a call's quantised activations may
// take before its rows are split into slices.
int64_t activation_budget() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<int64_t>(l2) / 2 : int64_t{1} << 20;
  }();
  return bytes;
}

// The most rows one slice of a many-row call takes over `nb` blocks a row (kquant_records_into)
int64_t slice_rows(int64_t nb) {
  const int64_t row_bytes = std::max<int64_t>(nb, 1) * static_cast<int64_t>(sizeof(Q8Block));
  return std::max(SLICE_MIN_ROWS, activation_budget() / row_bytes / TILE_ROWS * TILE_ROWS);
}

// y[:, col:col + n] = x W^T into y [M, >= col + n] (rows y.size(1) apart), in x's dtype.
// tile_rows: from how many rows Q4_K, Q6_K, Q8_0 and int8 rows take AMX tiles (0: vectors only, as a CPU
// without AMX; the bits are the same whatever it is, once it is not 0).
// swiglu: W's rows are a gate half and an up half (n / 2 each, whole groups), and y[:, :n / 2]
// gets silu(gate) * up instead, each unit of work a gate group and its up group (the bits of
// silu_mul on the plain product, without storing and reloading the product); AVX-512 VNNI.
//
// Many rows (a prompt's prefill) go in slices of whole tiles whose quantised activations fit
// activation_budget: every group of 16 columns reads all of a call's activations, which for
// 658 rows of an 8960-wide input are 10 MB, read again from L3 by each of the 96 groups; a
// slice re-reads the matrix instead, from L3 after the first. A row's bits are its own
// whatever rows share its call, so slices change no result.
void kquant_records_into(const at::Tensor& x, const at::Tensor& packed, int64_t qtype, int64_t n,
                         int64_t tile_rows, at::Tensor& y, int64_t col, bool swiglu = false,
                         int64_t* tokens = nullptr) {
  const bool known = qtype == TYPE_Q4_K || qtype == TYPE_Q6_K || qtype == TYPE_Q8_0 || qtype == TYPE_I8_ROW;
  const int64_t m = x.dim() == 2 ? x.size(0) : 0;
  const bool whole = tokens || (y.dim() == 2 && y.size(0) == m);
  if (!known || m <= 2 * SLICE_MIN_ROWS || packed.dim() != 2 || !whole) {
    return records_rows_into(x, packed, qtype, n, tile_rows, y, col, swiglu, tokens);
  }
  const int64_t most = slice_rows((packed.size(1) + record_bytes(qtype) - 1) / record_bytes(qtype));
  if (m <= most) return records_rows_into(x, packed, qtype, n, tile_rows, y, col, swiglu, tokens);
  const int64_t slices = (m + most - 1) / most;
  const int64_t each = ((m + slices - 1) / slices + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
  for (int64_t r0 = 0; r0 < m; r0 += each) {
    const int64_t rows = std::min(each, m - r0);
    at::Tensor yr = tokens ? y : y.narrow(0, r0, rows);
    records_rows_into(x.narrow(0, r0, rows), packed, qtype, n, tile_rows, yr, col, swiglu,
                      tokens ? tokens + r0 : nullptr);
  }
}

at::Tensor kquant_records_mm(const at::Tensor& x, const at::Tensor& packed, int64_t qtype, int64_t n,
                             int64_t tile_rows) {
  at::Tensor y = at::empty({x.size(0), n}, x.options());
  kquant_records_into(x, packed, qtype, n, tile_rows, y, 0);
  return y;
}

// The same into columns col..col + n - 1 of `out`: a fused projection's parts write their
// columns in place instead of being concatenated (a copy of the whole output per call)
void kquant_records_mm_out(const at::Tensor& x, const at::Tensor& packed, int64_t qtype, int64_t n,
                           int64_t tile_rows, at::Tensor out, int64_t col) {
  kquant_records_into(x, packed, qtype, n, tile_rows, out, col);
}

// silu(x G^T) * (x U^T) [M, n / 2] for a packed matrix whose rows are G then U (a fused
// gate/up projection): silu_mul(kquant_records_mm(x, ...)) bit for bit, in one pass.
at::Tensor kquant_records_swiglu(const at::Tensor& x, const at::Tensor& packed, int64_t qtype, int64_t n,
                                 int64_t tile_rows) {
  at::Tensor y = at::empty({x.size(0), n / 2}, x.options());
  kquant_records_into(x, packed, qtype, n, tile_rows, y, 0, true);
  return y;
}

// argmax(x W^T, -1) [M] int64, as greedy_rows reads kquant_records_mm's output (in x's dtype),
// without storing it: a greedy verify's head. AVX-512 VNNI records.
at::Tensor kquant_records_greedy(const at::Tensor& x, const at::Tensor& packed, int64_t qtype, int64_t n,
                                 int64_t tile_rows) {
  TORCH_CHECK(x.dim() == 2, "kquant_records_greedy: x must be [M, K]");
  at::Tensor tokens = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  at::Tensor none;
  kquant_records_into(x, packed, qtype, n, tile_rows, none, 0, false, tokens.data_ptr<int64_t>());
  return tokens;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftsman, m) {
  // tile_rows: from how many rows Q4_K, Q6_K, Q8_0, int8 rows take AMX tiles (0: vectors, as without AMX)
  m.def("kquant_records_mm(Tensor x, Tensor packed, int qtype, int n, int tile_rows) -> Tensor");
  m.def("kquant_records_mm_out(Tensor x, Tensor packed, int qtype, int n, int tile_rows, Tensor(a!) out, int col) -> ()");
  m.def("kquant_records_swiglu(Tensor x, Tensor packed, int qtype, int n, int tile_rows) -> Tensor");
  m.def("kquant_records_greedy(Tensor x, Tensor packed, int qtype, int n, int tile_rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftsman, CPU, m) {
  m.impl("kquant_records_mm", &kquant_records_mm);
  m.impl("kquant_records_mm_out", &kquant_records_mm_out);
  m.impl("kquant_records_swiglu", &kquant_records_swiglu);
  m.impl("kquant_records_greedy", &kquant_records_greedy);
}

// The most rows one slice of a many-row product takes over `nb` blocks a row (for the tests).
extern "C" int64_t draftsman_records_slice_rows(int64_t nb) { return slice_rows(nb); }

// Whether K-quant matrices can run on AMX tiles here: built with AMX-INT8 and granted by Linux.
extern "C" int draftsman_kquant_amx() { return amx_available() ? 1 : 0; }

// Whether Q4_K / Q6_K matrices can run on records here: built with AVX-512 VNNI or AVX2.
extern "C" int draftsman_kquant_records() { return records_available() ? 1 : 0; }

// Whether 8-bit matrices (Q8_0 blocks, int8 rows) can run on records here: AVX-512 VNNI.
extern "C" int draftsman_byte_records() { return byte_records_available() ? 1 : 0; }

// The vectors the records run on here: "avx512vnni", "avx2", or "" (none).
extern "C" const char* draftsman_records_isa() {
  return DRAFTSMAN_RECORDS ? "avx512vnni" : DRAFTSMAN_RECORDS_AVX2 ? "avx2" : "";
}
