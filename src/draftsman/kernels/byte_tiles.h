// The 8-bit records (q8_records.h) on AMX-INT8 tiles: int8 rows (q8's matrices) and Q8_0
// blocks (a GGUF's 8-bit and 5-bit matrices under q4). Both records hold their weights as
// q + 128, each 64-byte line 4 k x 16 columns in VNNI order, so nothing is unpacked: the
// record's lines are the B operand of a tile product, and the sums are the integers the
// vectors compute, then the vectors' float steps in the vectors' order. A row's bits are the
// same alone, in any batch, and on tiles or vectors.
#pragma once

#include <algorithm>
#include <cstdint>

#include "q8_records.h"

#if DRAFTSMAN_AMX
namespace draftsman_amx {

// One group of 16 int8 rows (TYPE_I8_ROW) against `rows` activation rows on AMX-INT8 tiles.
// Nothing to unpack: a record's weights (q + 128, each 64-byte line 4 k x 16 columns, two
// blocks of 32 k = 16 lines) are already the B operand of a 64-k tile product, loaded from the
// record itself. Per record and tile of rows, its PAIRS products sum C = sum_k x_q (q + 128);
// each row adds both offsets, C + i8_offsets[0] + i8_offsets[1], the integer that the vector
// path's two accumulators (q8_records.h) add up to, and the same float multiply-add follows:
// the same bits alone, in any batch and on either path.
//
// One tile of rows (a verify's 16 at most) keeps each row's 16 sums in a register across the
// blocks (i8_one_tile): the same multiply-adds in the same order, without a load and a store
// of every row's sums at every block (16 rows of the 0.5B's 151936 x 896 head from cache
// 4.18 -> 3.81 ms, from memory 6.01 -> 5.91, medians of 8 alternated rounds;
// bench-results/amx-q8-registers).

// C = one record's products against the tile of rows at xt (its PAIRS 64-k products), to cbuf
inline void i8_record_tile(const uint8_t* w, const Q8Block* xt, int pairs, int64_t xstride, int32_t* cbuf) {
  _tile_zero(0);
  for (int p = 0; p < pairs; ++p) {
    _tile_loadd(2, quants(xt) + 64 * p, xstride);
    // each weight is read once a forward: loaded with the streaming hint (tileloaddt1,
    // data of little reuse), the 1.5B q8's 16-row forward after 256 tokens took 66.3 / 68.4
    // / 69.6 / 71.0 ms against 68.8 / 69.6 / 73.2 / 76.3 with plain loads, alternated in
    // 4 pairs (bench-results/profile-amx-stream-loads/q8-stream-loads-ab.txt); the same bits
    _tile_stream_loadd(4, w + I8_OFF_Q + 1024 * p, 64);
    _tile_dpbsud(0, 2, 4);  // signed activations x unsigned weights
  }
  _tile_stored(0, cbuf, 64);
}

// a row's sums after one more record: sums + (d_w d_x) float(C + both offsets). |C| <= 256 *
// 127 * 255 and the offsets cancel the 128s: exact in int32
inline __m512 i8_row_step(const int32_t* crow, const Q8Block& xb, __m512 d, __m512 sums) {
  const __m512i c = _mm512_add_epi32(_mm512_load_si512(crow), _mm512_set1_epi32(xb.i8_offsets[0] + xb.i8_offsets[1]));
  return _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(c), sums);
}

// the record 8 ahead spread over the rows (4 lines a row: a tile of 16 rows issues the whole
// record), not one burst at its end that stalls on the fill buffers
inline void i8_row_prefetch(RecordPrefetch& ahead) {
  for (int l = 0; l < 4; ++l) ahead.line();
}

inline void i8_one_tile(const uint8_t* w, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                 int64_t block_step, int rows, float* acc) {
  alignas(64) int32_t cbuf[TILE_ROWS * COLS];
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  __m512 sums[TILE_ROWS];
#pragma GCC unroll 16
  for (int m = 0; m < TILE_ROWS; ++m) sums[m] = m < rows ? _mm512_loadu_ps(acc + COLS * m) : _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const bool last_half = half && b == nb - 1;
    RecordPrefetch ahead(w, record_bytes(TYPE_I8_ROW));
    const I8Scales s(w);
    const Q8Block* xt = x + b * block_step;
    i8_record_tile(w, xt, last_half ? HALF_PAIRS : 4, xstride, cbuf);
#pragma GCC unroll 16
    for (int m = 0; m < TILE_ROWS; ++m) {
      if (m < rows) {
        i8_row_prefetch(ahead);
        sums[m] = i8_row_step(cbuf + COLS * m, xt[m * row_step], s.d, sums[m]);
      }
    }
    ahead.rest();
    w += last_half ? half_record_bytes(TYPE_I8_ROW) : record_bytes(TYPE_I8_ROW);
  }
#pragma GCC unroll 16
  for (int m = 0; m < TILE_ROWS; ++m) {
    if (m < rows) _mm512_storeu_ps(acc + COLS * m, sums[m]);
  }
}

inline void i8_group_tiles(const uint8_t* w, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                    int64_t block_step, int rows, float* acc) {
  if (rows <= TILE_ROWS) return i8_one_tile(w, x, nb, half, row_step, block_step, rows, acc);
  alignas(64) int32_t cbuf[TILE_ROWS * COLS];
  const int ntiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  for (int64_t b = 0; b < nb; ++b) {
    const bool last_half = half && b == nb - 1;
    RecordPrefetch ahead(w, record_bytes(TYPE_I8_ROW));
    const I8Scales s(w);
    for (int t = 0; t < ntiles; ++t) {
      const Q8Block* xt = x + t * TILE_ROWS * row_step + b * block_step;
      i8_record_tile(w, xt, last_half ? HALF_PAIRS : 4, xstride, cbuf);
      const int tile_rows = std::min(TILE_ROWS, rows - t * TILE_ROWS);
      for (int m = 0; m < tile_rows; ++m) {
        i8_row_prefetch(ahead);
        float* a = acc + COLS * (t * TILE_ROWS + m);
        _mm512_storeu_ps(a, i8_row_step(cbuf + COLS * m, xt[m * row_step], s.d, _mm512_loadu_ps(a)));
      }
    }
    ahead.rest();
    w += last_half ? half_record_bytes(TYPE_I8_ROW) : record_bytes(TYPE_I8_ROW);
  }
}

// One group of 16 Q8_0 weight rows against `rows` activation rows on AMX-INT8 tiles
// (configure_tiles(rows, 32): each Q8_0 block of 32 k has its own float16 scale, so each is
// one 32-k product of its own). Per record, tile of rows and block j,
//   C_j = sum_k x_q (q + 128)   (the tile),  C_j + q8_offsets[j] = sum_k x_q q,
// the integer of the vector path's accumulators (q8_records.h), and each row then takes the
// vectors' float steps in their order: isum = fma(C_j, d_j, isum) for j = 0.., then
// acc = fma(d_x, isum, acc). The 16 rows of the 0.5B q4's Q5_0 and Q8_0 matrices (most of its
// bytes) had run on vectors, 2.5x one row from cache (4864 x 896), where int8 rows on tiles
// take 1.3x.

// the record's BLOCKS products against the tile of rows at xt, C_j to cbuf + j * 256
inline void q8_record_tile(const uint8_t* w, const Q8Block* xt, int blocks, int64_t xstride, int32_t* cbuf) {
  for (int j = 0; j < blocks; j += 2) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, quants(xt) + 32 * j, xstride);
    _tile_stream_loadd(4, w + Q8_OFF_Q + 512 * j, 64);  // read once a forward, as i8_record_tile
    _tile_dpbsud(0, 2, 4);
    _tile_loadd(3, quants(xt) + 32 * (j + 1), xstride);
    _tile_stream_loadd(5, w + Q8_OFF_Q + 512 * (j + 1), 64);
    _tile_dpbsud(1, 3, 5);
    _tile_stored(0, cbuf + TILE_ROWS * COLS * j, 64);
    _tile_stored(1, cbuf + TILE_ROWS * COLS * (j + 1), 64);
  }
}

// row m's sums after one more record: the vector path's float steps over its BLOCKS C_j
template <int BLOCKS>
inline __m512 q8_row_step(const int32_t* cbuf, int m, const Q8Block& xb, const Q8Scales& s, __m512 sums) {
  __m512 isum = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int j = 0; j < BLOCKS; ++j) {
    const __m512i c = _mm512_add_epi32(_mm512_load_si512(cbuf + TILE_ROWS * COLS * j + COLS * m),
                                       _mm512_set1_epi32(xb.q8_offsets[j]));
    isum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), s.d[j], isum);
  }
  return _mm512_fmadd_ps(_mm512_set1_ps(xb.d), isum, sums);
}

inline void q8_group_tiles(const uint8_t* w, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                    int64_t block_step, int rows, float* acc) {
  alignas(64) int32_t cbuf[8 * TILE_ROWS * COLS];
  const int ntiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  for (int64_t b = 0; b < nb; ++b) {
    const bool last_half = half && b == nb - 1;
    RecordPrefetch ahead(w, record_bytes(TYPE_Q8_0));
    const Q8Scales s(w);
    for (int t = 0; t < ntiles; ++t) {
      const Q8Block* xt = x + t * TILE_ROWS * row_step + b * block_step;
      q8_record_tile(w, xt, last_half ? 2 * HALF_PAIRS : 8, xstride, cbuf);
      const int tile_rows = std::min(TILE_ROWS, rows - t * TILE_ROWS);
      for (int m = 0; m < tile_rows; ++m) {
        i8_row_prefetch(ahead);
        float* a = acc + COLS * (t * TILE_ROWS + m);
        const __m512 sums = _mm512_loadu_ps(a);
        _mm512_storeu_ps(a, last_half ? q8_row_step<2 * HALF_PAIRS>(cbuf, m, xt[m * row_step], s, sums)
                                      : q8_row_step<8>(cbuf, m, xt[m * row_step], s, sums));
      }
    }
    ahead.rest();
    w += last_half ? half_record_bytes(TYPE_Q8_0) : record_bytes(TYPE_Q8_0);
  }
}

}  // namespace draftsman_amx
#endif
