// The record layout of K-quant weights repacked for AMX tiles (gguf_pack_records.cpp writes it,
// gguf_matmul_records.cpp reads it).
//
// Weights are repacked once at load (`kquant_pack_records`) into groups of 16 weight rows, each
// 256-wide block of a group in one record. B operands are in AMX's VNNI layout: K/4 rows of
// 16 columns x 4 consecutive weights. Q4_K, 2368 bytes (2.8% more than the 16 blocks):
//   [0, 32)      d, f16 x 16 columns
//   [32, 64)     dmin, f16 x 16
//   [64, 192)    sub-block scales, u8 [8 sub-blocks][16 columns]
//   [192, 320)   sub-block mins, u8 [4 pairs t][16 columns][m_2t, m_2t+1]
//   [320, 2368)  nibbles, u8 [4 pairs p][8 k-rows r][16 columns][4]: byte (p, r, c, i) is
//                the GGUF's byte 32p + 4r + i of column c's block: its low nibble is element
//                4r + i of sub-block 2p, its high nibble the same element of sub-block 2p + 1.
// Q6_K, 3360 bytes (exactly the 16 blocks):
//   [0, 32)      d, f16 x 16
//   [32, 288)    sub-block scales, s8 [16 sub-blocks][16 columns]
//   [288, 2336)  low 4 bits, u8 [8 pairs p][4 k-rows][16 columns][4]: sub-block 2p low
//                nibble, 2p + 1 high
//   [2336, 3360) high 2 bits, u8 [4 quads u][4 k-rows][16 columns][4]: bits 2s, 2s + 1 of
//                sub-block 4u + s
// Q8_0, 4352 bytes (exactly the 16 columns' 8 blocks of 32; missing blocks past a row's end
// are zero, d = 0):
//   [0, 256)     d, f16 [8 blocks j][16 columns]
//   [256, 4352)  q + 128, u8 [8 blocks j][8 k-rows r][16 columns][4]: byte (j, r, c, i) is
//                element 4r + i of column c's block j, offset to unsigned for vpdpbusd
// (the 0.5B's Q5_0 blocks take this record too: w = d (q5 - 16), q5 - 16 in -16..15)
// int8 rows (one float32 scale per output row: w = d q), 4160 bytes:
//   [0, 64)      d, f32 x 16 columns
//   [64, 4160)   q + 128, u8 laid out as Q8_0's (k past the row's end: q = 0 stored as 128)

#pragma once

#include <cstdint>

#include "kquant_blocks.h"

namespace draftsman_amx {

using draftsman_kquant::TYPE_Q4_K;
using draftsman_kquant::TYPE_Q6_K;
using draftsman_kquant::TYPE_Q8_0;

constexpr int COLS = 16;       // weight rows per group: a tile's 16 int32 columns
constexpr int TILE_ROWS = 16;  // activation rows per tile
constexpr int OFF_D = 0, OFF_DMIN = 32, OFF_SC = 64, OFF_MIN = 192, OFF_Q = 320;
constexpr int RECORD = 2368;  // Q4_K bytes per (group, block)
constexpr int Q6_OFF_D = 0, Q6_OFF_SC = 32, Q6_OFF_QL = 288, Q6_OFF_QH = 2336;
constexpr int Q6_RECORD = 3360;
constexpr int Q8_OFF_D = 0, Q8_OFF_Q = 256;
constexpr int Q8_RECORD = 4352;
constexpr int64_t TYPE_I8_ROW = 1000;  // not a GGML type: int8 rows with one scale each
constexpr int I8_OFF_D = 0, I8_OFF_Q = 64;
constexpr int I8_RECORD = 4160;

constexpr int record_bytes(int64_t qtype) {
  return qtype == TYPE_Q4_K ? RECORD : qtype == TYPE_Q6_K ? Q6_RECORD : qtype == TYPE_Q8_0 ? Q8_RECORD : I8_RECORD;
}

// Half records. A width that ends 128 or fewer k into its last block (the 0.5B's 896 = 3.5
// blocks) keeps only that record's first half of weights: pairs 0 and 1 of Q4_K's sub-blocks,
// blocks 0-3 of the 8-bit records, which the layouts above put first (the header stays
// whole). The missing k would multiply zero activations, so the sums are bit for bit those
// of the whole record; a group's last record is then this many bytes instead of
// record_bytes, and ~12.5% of such a matrix is neither streamed nor multiplied. Q6_K has
// none (0: never half).
constexpr int HALF_K = 128;
constexpr int HALF_PAIRS = 2;  // of 4 pairs of 32-k sub-blocks (or blocks) a record
constexpr int half_record_bytes(int64_t qtype) {
  return qtype == TYPE_Q4_K ? OFF_Q + 1024 : qtype == TYPE_Q6_K ? 0 : qtype == TYPE_Q8_0 ? Q8_OFF_Q + 2048 : I8_OFF_Q + 2048;
}

}  // namespace draftsman_amx
