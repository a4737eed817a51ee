// Keys in VNNI pairs, the B operand of Q K^T for the attentions that multiply bf16 pairs into
// fp32: AMX-BF16 tiles (attention_amx.cpp, tdpbf16ps) and AVX512-BF16 vectors
// (attention_bf16.cpp, vdpbf16ps). Built once a task from the cache's keys as they lie.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define DRAFTSMAN_KEY_PAIRS 1
#else
#define DRAFTSMAN_KEY_PAIRS 0
#endif

#if DRAFTSMAN_KEY_PAIRS
namespace draftsman_attention::key_pairs {

constexpr int64_t TILE = 16;  // keys of a key block

// out[r] = lane r of each of a[0..16): a 16 x 16 transpose of 4-byte elements in registers
// (pairs of 32-bit, then 64-bit lanes interleaved, then 128-bit lanes gathered twice)
inline void transpose16(const __m512i* a, __m512i* out) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(a[i], a[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(a[i], a[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + k]: elements k, 4 + k, 8 + k, 12 + k of rows i..i+3
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {  // row 4 L + k: 128-bit lane L of u[k], u[4 + k], u[8 + k], u[12 + k]
    const __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), w0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
    const __m512i v1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
    out[k] = _mm512_shuffle_i32x4(v0, v1, 0x88);
    out[8 + k] = _mm512_shuffle_i32x4(v0, v1, 0xDD);
    out[4 + k] = _mm512_shuffle_i32x4(w0, w1, 0x88);
    out[12 + k] = _mm512_shuffle_i32x4(w0, w1, 0xDD);
  }
}

// Keys in VNNI pairs for B of Q K^T: for key block kb (16 keys) and dim chunk c (32 dims),
// a 1 KB tile whose row r holds dims 32c + 2r, 32c + 2r + 1 of each of the 16 keys: a 16 x 16
// transpose of the keys' 4-byte pairs (keys read in order, as they lie). Keys at and past s
// are zero.
inline void transpose_keys(const uint32_t* k32, int64_t stride32, int64_t s, int64_t s_pad, int64_t chunks,
                    uint32_t* kt) {
  for (int64_t kb = 0; kb < s_pad / TILE; ++kb) {
    const int64_t live = std::clamp<int64_t>(s - kb * TILE, 0, TILE);
    for (int64_t c = 0; c < chunks; ++c) {
      __m512i rows[16], cols[16];
      for (int64_t i = 0; i < TILE; ++i) {
        rows[i] = i < live ? _mm512_loadu_si512(k32 + (kb * TILE + i) * stride32 + 16 * c) : _mm512_setzero_si512();
      }
      transpose16(rows, cols);
      uint32_t* tile = kt + (kb * chunks + c) * 256;
      for (int r = 0; r < 16; ++r) _mm512_store_si512(tile + 16 * r, cols[r]);
    }
  }
}

}  // namespace draftsman_attention::key_pairs
#endif
