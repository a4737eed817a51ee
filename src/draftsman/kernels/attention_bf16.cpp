// The scores of a few new bf16 rows against a bf16 KV cache on AVX512-BF16 vectors.
//
// The fp32 AVX-512 attention (attention_ops.cpp, attend_wide) widens a task's keys to fp32,
// transposes them and takes one fma per query row, key and dim: 16 products an instruction.
// vdpbf16ps multiplies a pair of dims in each of its 16 lanes, 32 products an instruction, on
// keys of half the bytes: the AMX tiles' key operand (bf16_key_pairs.h: 16 keys a vector, each
// lane a key's pair of dims), against each query row's pair of dims broadcast. Products of
// bf16 are exact in fp32 and summed in fp32, so the scores differ from the fp32 path's only in
// the summation's roundings; the softmax and the weighted values stay attend_wide's, on fp32
// P. (P in bf16, as the AMX tiles take it, would halve that half too, but cost the 1.5B q4
// 0.5% of perplexity on ShareGPT, 5 chunks of 5 worse, with 16-row steps: not taken here.)

#include "attention_bf16.h"

#include "bf16_key_pairs.h"
#include "env_switch.h"

namespace draftsman_attention {

bool bf16_pairs_attention_available() {
#if DRAFTSMAN_KEY_PAIRS
  // DRAFTSMAN_ATTENTION_BF16=0: the fp32 scores on the same CPU (to measure one against the other)
  static const bool off = draftsman_env::turned_off("DRAFTSMAN_ATTENTION_BF16");
  return !off;
#else
  return false;
#endif
}

#if DRAFTSMAN_KEY_PAIRS
namespace {

using key_pairs::TILE;
constexpr int KEY_BLOCKS = KEY_PAIRS_STEP / TILE;  // 4 blocks of 16 keys a pass

inline __m512bh as_pairs(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

// sc[i][16 kb ..) = scale (q_i . k) for R query rows (their dim pairs at q32 + i * half_d)
// against KEY_BLOCKS key blocks from kb of kt: per dim pair one vdpbf16ps a row and block, the
// blocks' operands loaded once for all R rows
template <int R>
inline void score_block(const uint32_t* q32, int64_t half_d, const uint32_t* kt, int64_t chunks, int64_t kb,
                        float scale, float* sc, int64_t s_pad) {
  __m512 acc[R][KEY_BLOCKS];
  for (int i = 0; i < R; ++i) {
    for (int v = 0; v < KEY_BLOCKS; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < chunks; ++c) {
    for (int r = 0; r < 16; ++r) {  // dims 32c + 2r, 32c + 2r + 1
      __m512bh kv[KEY_BLOCKS];
      for (int v = 0; v < KEY_BLOCKS; ++v) kv[v] = as_pairs(_mm512_load_si512(kt + ((kb + v) * chunks + c) * 256 + 16 * r));
      for (int i = 0; i < R; ++i) {
        const __m512bh qp = as_pairs(_mm512_set1_epi32(static_cast<int>(q32[i * half_d + 16 * c + r])));
        for (int v = 0; v < KEY_BLOCKS; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], qp, kv[v]);
      }
    }
  }
  const __m512 f = _mm512_set1_ps(scale);
  for (int i = 0; i < R; ++i) {
    for (int v = 0; v < KEY_BLOCKS; ++v) _mm512_storeu_ps(sc + i * s_pad + (kb + v) * TILE, _mm512_mul_ps(acc[i][v], f));
  }
}

}  // namespace

// the keys in VNNI pairs once, then a pass of 64 keys (16 KiB of kt at d = 128, in L1) for
// every row, 4 rows at a time, then 2, then 1
void bf16_pair_scores(const uint16_t* keys, int64_t kstride, int64_t s, int64_t s_pad, int64_t d,
                      const uint32_t* q32, int64_t n, float scale, uint32_t* kt, float* sc) {
  const int64_t half_d = d / 2, chunks = d / 32;
  key_pairs::transpose_keys(reinterpret_cast<const uint32_t*>(keys), kstride / 2, s, s_pad, chunks, kt);
  for (int64_t kb = 0; kb < s_pad / TILE; kb += KEY_BLOCKS) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) score_block<4>(q32 + i * half_d, half_d, kt, chunks, kb, scale, sc + i * s_pad, s_pad);
    for (; i + 2 <= n; i += 2) score_block<2>(q32 + i * half_d, half_d, kt, chunks, kb, scale, sc + i * s_pad, s_pad);
    for (; i < n; ++i) score_block<1>(q32 + i * half_d, half_d, kt, chunks, kb, scale, sc + i * s_pad, s_pad);
  }
}
#else
void bf16_pair_scores(const uint16_t*, int64_t, int64_t, int64_t, int64_t, const uint32_t*, int64_t, float,
                      uint32_t*, float*) {}
#endif

}  // namespace draftsman_attention

// Whether the scores of bf16 rows run on AVX512-BF16 pairs here (for Python's reports).
extern "C" int draftsman_attention_bf16_pairs() {
  return draftsman_attention::bf16_pairs_attention_available() ? 1 : 0;
}
