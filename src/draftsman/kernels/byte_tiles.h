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
// Internal linkage, as in the one file that includes this (gguf_matmul_records.cpp): with
// external linkage the compiler must allow for another library's definition of these and
// neither inlines nor specialises them (the 0.5B q8's 16 rows ~0.8 ms slower a forward).
namespace {

// A record's weight lines as the tiles take them (the B operands). Streamed from the record
// itself: its bytes q + 128, multiplied as unsigned (tdpbsud), and each row adds its
// activations' -128 sums. Or copied once with their top bits flipped, which makes them q,
// multiplied as signed (tdpbssd), and the rows add nothing: 3 operations a line, which pay
// once enough tiles of rows share the copy (`FLIP_FROM_TILES`). The integers are the same.
template <bool FLIPPED>
struct WeightLines {
  const uint8_t* b;
  WeightLines(const uint8_t* lines, int /*count*/) : b(lines) {}
};

template <>
struct WeightLines<true> {
  alignas(64) uint8_t b[64 * 64];
  WeightLines(const uint8_t* lines, int count) {
    const __m512i top = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int l = 0; l < count; ++l) {
      _mm512_store_si512(b + 64 * l, _mm512_xor_si512(_mm512_loadu_si512(lines + 64 * l), top));
    }
  }
};

// The weights' tile load: plain where flipped (a copy in L1), else with the streaming hint
// (tileloaddt1, data of little reuse: each weight is read once a forward; the 1.5B q8's
// 16-row forward after 256 tokens took 66.3 / 68.4 / 69.6 / 71.0 ms against 68.8 / 69.6 /
// 73.2 / 76.3 with plain loads, alternated in 4 pairs,
// bench-results/profile-amx-stream-loads/q8-stream-loads-ab.txt; the same bits). The tile
// intrinsics take register numbers as literals: S picks a pair, sum 0 from A tmm2 and B tmm4,
// or sum 1 from tmm3 and tmm5.
template <bool FLIPPED, int S>
inline void weight_product(const uint8_t* b) {
  static_assert(S == 0 || S == 1, "two sums");
  if constexpr (FLIPPED && S == 0) {
    _tile_loadd(4, b, 64);
    _tile_dpbssd(0, 2, 4);  // signed activations x signed weights
  } else if constexpr (FLIPPED) {
    _tile_loadd(5, b, 64);
    _tile_dpbssd(1, 3, 5);
  } else if constexpr (S == 0) {
    _tile_stream_loadd(4, b, 64);
    _tile_dpbsud(0, 2, 4);  // signed activations x unsigned weights
  } else {
    _tile_stream_loadd(5, b, 64);
    _tile_dpbsud(1, 3, 5);
  }
}

// A kind of 8-bit record on tiles (I8Tiles, Q8Tiles): its tile depth (configure_tiles' k),
// where its weight lines start, their products against a tile of rows into int32 sums, and a row's step from
// those sums.

// int8 rows (TYPE_I8_ROW): C = one record's PAIRS 64-k products against the tile of rows at
// xt, to cbuf (each 64 k = 16 lines of the record); a row's step:
// sums + (d_w d_x) float(C + both offsets). |C| <= 256 * 127 * 255 and the offsets cancel
// the 128s: exact in int32. Flipped from 4 tiles of rows: 256 rows of 4864 x 896 from cache
// 1.19-1.23 -> 0.98-1.01 ms, 64 rows level; a single tile flipped was slower (16 rows 0.095
// -> 0.109), so it streams.
struct I8Tiles {
  static constexpr int64_t QTYPE = TYPE_I8_ROW;
  static constexpr int CBUF = TILE_ROWS * COLS;
  static constexpr int DEPTH = 64, LINES = I8_OFF_Q, FLIP_FROM_TILES = 4;
  static constexpr int ROW_LINES = 4;  // of the record ahead a row fetches (its products none)
  using Scales = I8Scales;
  template <bool FLIPPED>
  static void record(const uint8_t* b, bool half, const Q8Block* xt, int64_t xstride, int32_t* cbuf,
                     RecordPrefetch* /*ahead*/) {  // 4 products: the rows fetch the record ahead
    _tile_zero(0);
    for (int p = 0; p < (half ? HALF_PAIRS : 4); ++p) {
      _tile_loadd(2, quants(xt) + 64 * p, xstride);
      weight_product<FLIPPED, 0>(b + 1024 * p);
    }
    _tile_stored(0, cbuf, 64);
  }
  template <bool FLIPPED>
  static __m512 row(const int32_t* cbuf, int m, const Q8Block& xb, const Scales& s, bool /*half*/, __m512 sums) {
    __m512i c = _mm512_load_si512(cbuf + COLS * m);
    if constexpr (!FLIPPED) c = _mm512_add_epi32(c, _mm512_set1_epi32(xb.i8_offsets[0] + xb.i8_offsets[1]));
    return _mm512_fmadd_ps(_mm512_mul_ps(s.d, _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(c), sums);
  }
};

// Q8_0 blocks: each block of 32 k has its own float16 scale, so each is a 32-k product of its
// own (DEPTH 32): per record, tile of rows and block j
//   C_j = sum_k x_q q   (with the offsets where the lines are streamed: the integer of the
//                        vector path's accumulators, q8_records.h),
// and a row then takes the vectors' float steps in their order: isum = fma(C_j, d_j, isum)
// for j = 0.., then sums = fma(d_x, isum, sums). Flipped from 2 tiles of rows (each row
// spares an offset per block): 256 rows of 4864 x 896 2.03-2.21 -> 1.64-1.81 ms.
struct Q8Tiles {
  static constexpr int64_t QTYPE = TYPE_Q8_0;
  static constexpr int CBUF = 8 * TILE_ROWS * COLS;  // C_j at cbuf + j * 256
  static constexpr int DEPTH = 32, LINES = Q8_OFF_Q, FLIP_FROM_TILES = 2;
  // The record ahead: 8 lines a pair of blocks as its products run (32 of its 68) and 2 a row.
  // Fetched by the rows alone, a verify's 16 rows of the 0.5B q4 ran slower on tiles than on
  // vectors (33.3 against 31.1 ms): the tile work of 8 products and 8 stores left the memory
  // idle. With these fetches, 30.2 against 33.0 (bench-results/amx-q8-0-tiles).
  static constexpr int ROW_LINES = 2;
  using Scales = Q8Scales;
  template <bool FLIPPED>
  static void record(const uint8_t* b, bool half, const Q8Block* xt, int64_t xstride, int32_t* cbuf,
                     RecordPrefetch* ahead) {
    for (int j = 0; j < (half ? 2 * HALF_PAIRS : 8); j += 2) {
      if (ahead) {
        for (int l = 0; l < 8; ++l) ahead->line();
      }
      _tile_zero(0);
      _tile_zero(1);
      _tile_loadd(2, quants(xt) + 32 * j, xstride);
      weight_product<FLIPPED, 0>(b + 512 * j);
      _tile_loadd(3, quants(xt) + 32 * (j + 1), xstride);
      weight_product<FLIPPED, 1>(b + 512 * (j + 1));
      _tile_stored(0, cbuf + TILE_ROWS * COLS * j, 64);
      _tile_stored(1, cbuf + TILE_ROWS * COLS * (j + 1), 64);
    }
  }
  template <bool FLIPPED, int BLOCKS>
  static __m512 row_blocks(const int32_t* cbuf, int m, const Q8Block& xb, const Scales& s, __m512 sums) {
    __m512 isum = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < BLOCKS; ++j) {
      __m512i c = _mm512_load_si512(cbuf + TILE_ROWS * COLS * j + COLS * m);
      if constexpr (!FLIPPED) c = _mm512_add_epi32(c, _mm512_set1_epi32(xb.q8_offsets[j]));
      isum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), s.d[j], isum);
    }
    return _mm512_fmadd_ps(_mm512_set1_ps(xb.d), isum, sums);
  }
  template <bool FLIPPED>
  static __m512 row(const int32_t* cbuf, int m, const Q8Block& xb, const Scales& s, bool half, __m512 sums) {
    return half ? row_blocks<FLIPPED, 2 * HALF_PAIRS>(cbuf, m, xb, s, sums)
                : row_blocks<FLIPPED, 8>(cbuf, m, xb, s, sums);
  }
};

// the record 8 ahead spread over the work (int8 rows: 4 lines a row, so that a tile of 16 rows
// issues the whole record), not one burst at its end that stalls on the fill buffers
template <typename K>
inline void byte_row_prefetch(RecordPrefetch& ahead) {
  for (int l = 0; l < K::ROW_LINES; ++l) ahead.line();
}

// One group of 16 weight rows against one tile of rows (a verify's 16 at most), each row's 16
// sums in a register across the blocks: the same multiply-adds in the same order as through
// memory, without a load and a store of every row's sums at every block (int8 rows: 16 rows
// of the 0.5B's 151936 x 896 head from cache 4.18 -> 3.81 ms, from memory 6.01 -> 5.91,
// medians of 8 alternated rounds; bench-results/amx-q8-registers).
template <typename K>
void byte_one_tile(const uint8_t* w, const Q8Block* x, int64_t nb, bool half, int64_t row_step, int64_t block_step,
                   int rows, float* acc) {
  alignas(64) int32_t cbuf[K::CBUF];
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  __m512 sums[TILE_ROWS];
#pragma GCC unroll 16
  for (int m = 0; m < TILE_ROWS; ++m) sums[m] = m < rows ? _mm512_loadu_ps(acc + COLS * m) : _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const bool last_half = half && b == nb - 1;
    RecordPrefetch ahead(w, record_bytes(K::QTYPE));
    const typename K::Scales s(w);
    const Q8Block* xt = x + b * block_step;
    K::template record<false>(w + K::LINES, last_half, xt, xstride, cbuf, &ahead);
#pragma GCC unroll 16
    for (int m = 0; m < TILE_ROWS; ++m) {
      if (m < rows) {
        byte_row_prefetch<K>(ahead);
        sums[m] = K::template row<false>(cbuf, m, xt[m * row_step], s, last_half, sums[m]);
      }
    }
    ahead.rest();
    w += last_half ? half_record_bytes(K::QTYPE) : record_bytes(K::QTYPE);
  }
#pragma GCC unroll 16
  for (int m = 0; m < TILE_ROWS; ++m) {
    if (m < rows) _mm512_storeu_ps(acc + COLS * m, sums[m]);
  }
}

// The same against more rows (whole tiles, each row's sums in acc), the weight lines streamed
// or flipped (WeightLines).
template <typename K, bool FLIPPED>
void byte_tiles_of_rows(const uint8_t* w, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                        int64_t block_step, int rows, float* acc) {
  alignas(64) int32_t cbuf[K::CBUF];
  const int ntiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
  const int64_t xstride = row_step * static_cast<int64_t>(sizeof(Q8Block));
  for (int64_t b = 0; b < nb; ++b) {
    const bool last_half = half && b == nb - 1;
    RecordPrefetch ahead(w, record_bytes(K::QTYPE));
    const typename K::Scales s(w);
    const WeightLines<FLIPPED> lines(w + K::LINES, last_half ? 32 : 64);
    for (int t = 0; t < ntiles; ++t) {
      const Q8Block* xt = x + t * TILE_ROWS * row_step + b * block_step;
      K::template record<FLIPPED>(lines.b, last_half, xt, xstride, cbuf, t == 0 ? &ahead : nullptr);
      const int tile_rows = std::min(TILE_ROWS, rows - t * TILE_ROWS);
      for (int m = 0; m < tile_rows; ++m) {
        byte_row_prefetch<K>(ahead);
        float* a = acc + COLS * (t * TILE_ROWS + m);
        _mm512_storeu_ps(a, K::template row<FLIPPED>(cbuf, m, xt[m * row_step], s, last_half, _mm512_loadu_ps(a)));
      }
    }
    ahead.rest();
    w += last_half ? half_record_bytes(K::QTYPE) : record_bytes(K::QTYPE);
  }
}

// One group of 16 weight rows against `rows` activation rows on tiles.
template <typename K>
void byte_group_tiles(const uint8_t* w, const Q8Block* x, int64_t nb, bool half, int64_t row_step,
                      int64_t block_step, int rows, float* acc) {
  if (rows <= TILE_ROWS) return byte_one_tile<K>(w, x, nb, half, row_step, block_step, rows, acc);
  if (rows > (K::FLIP_FROM_TILES - 1) * TILE_ROWS) {
    return byte_tiles_of_rows<K, true>(w, x, nb, half, row_step, block_step, rows, acc);
  }
  byte_tiles_of_rows<K, false>(w, x, nb, half, row_step, block_step, rows, acc);
}

}  // namespace
}  // namespace draftsman_amx
#endif
