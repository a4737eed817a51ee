// The scores of a few new bf16 rows against a bf16 KV cache on AVX512-BF16 vectors
// (kernels/attention_bf16.cpp), for attention_ops.cpp's AVX-512 path where no AMX tiles take
// the rows.
#pragma once

#include <cstdint>

namespace draftsman_attention {

// Whether bf16_pair_scores runs here: built with AVX512-BF16 (Zen 4 and later EPYCs, Cooper
// Lake and later Xeons) and not turned off by DRAFTSMAN_ATTENTION_BF16=0.
bool bf16_pairs_attention_available();

// sc[i][j] = scale (q_i . k_j) for n query rows and s keys, keys padded with zeros to s_pad (a
// multiple of KEY_PAIRS_STEP): keys [s x d] bf16 (rows kstride elements apart, d a multiple of
// 32), q32 the query rows' bf16 dims as pairs (row i at q32 + i d / 2), kt scratch for the keys
// in VNNI pairs (s_pad d / 2 dwords, 64-byte aligned; bf16_key_pairs.h), sc rows s_pad floats
// apart. Each score is one chain of vdpbf16ps over its dims in order, then the one multiply by
// scale, whatever n or the key's place: a row's scores are the same alone or among others.
// Only where bf16_pairs_attention_available().
void bf16_pair_scores(const uint16_t* keys, int64_t kstride, int64_t s, int64_t s_pad, int64_t d,
                      const uint32_t* q32, int64_t n, float scale, uint32_t* kt, float* sc);

constexpr int64_t KEY_PAIRS_STEP = 64;  // keys a scoring pass: four blocks of 16

}  // namespace draftsman_attention
