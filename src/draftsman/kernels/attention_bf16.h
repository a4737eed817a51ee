// The scores of a few new bf16 rows against a bf16 KV cache on AVX512-BF16 vectors
// (kernels/attention_bf16.cpp), for attention_ops.cpp's AVX-512 path where no AMX tiles take
// the rows.
#pragma once

#include <cstdint>

namespace draftsman_attention {

// Whether bf16_pair_scores runs here: built with AVX512-BF16 (Zen 4 and later EPYCs, Cooper
// Lake and later Xeons) and not turned off by DRAFTSMAN_ATTENTION_BF16=0.
bool bf16_pairs_attention_available();

// sc[i][j] = scale (q_i . k_j) for n query rows and s_pad keys (a multiple of KEY_PAIRS_STEP):
// q32 holds the rows' bf16 dims as pairs (row i at q32 + i d / 2), kt the keys in VNNI pairs
// (bf16_key_pairs.h, 64-byte aligned), sc rows s_pad floats apart. Each score is one chain of
// vdpbf16ps over its dims in order, then the one multiply by scale, whatever n or the key's
// place: a row's scores are the same alone or among others. Only where
// bf16_pairs_attention_available().
void bf16_pair_scores(const uint32_t* q32, int64_t n, int64_t d, const uint32_t* kt, int64_t s_pad, float scale,
                      float* sc);

constexpr int64_t KEY_PAIRS_STEP = 64;  // keys a scoring pass: four blocks of 16

}  // namespace draftsman_attention
