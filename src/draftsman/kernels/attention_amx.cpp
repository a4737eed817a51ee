// Attention of a few new bf16 rows against a bf16 KV cache on AMX-BF16 tiles.
//
// The vector path (attention_ops.cpp) scores each query row against each key with fp32
// fmas: at 16 new rows of a GQA model (6 query heads a KV head) that is ~100 query rows a
// head, compute-bound, ~7 ms of a 1.5B forward at 256 cached tokens and twice that at 512.
// A tile multiply (tdpbf16ps) takes 16 query rows x 16 keys x 32 head dims at once:
//   scores  S = Q K^T   A: 16 query rows x 32 dims (bf16, as the cache holds them)
//                       B: the same 32 dims of 16 keys, VNNI pairs (keys transposed once a task)
//   weights O = P V     A: 16 query rows x 32 keys of P, the softmax numerators in bf16
//                       B: 32 keys of 16 value dims, VNNI pairs (values interleaved once)
// Products are exact in fp32 and summed in fp32; the only rounding beyond the vector path's
// is P to bf16 (as flash attention does on GPUs), normalised by the sum of the rounded P.
//
// Invariant (batch invariance): every output row depends on its own query row, the cache and
// its bias row only: a tile's element (m, n) is computed from row m of A and column n of B,
// and the padding (query rows to 16, keys to 64) is the same whatever the other rows. So a
// row's result is the same alone or among up to 16 new rows, in any task split.

#include "attention_amx.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "amx_tiles.h"
#include "bf16_key_pairs.h"
#include "env_switch.h"
#include "simd_math.h"

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512F__) && \
    defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define DRAFTSMAN_AMX_BF16 1
#else
#define DRAFTSMAN_AMX_BF16 0
#endif

namespace draftsman_attention {

bool amx_attention_available() {
#if DRAFTSMAN_AMX_BF16
  // DRAFTSMAN_ATTENTION_AMX=0: the vector path on the same CPU (to measure one against the other)
  static const bool off = draftsman_env::turned_off("DRAFTSMAN_ATTENTION_AMX");
  return !off && draftsman_amx::amx_permitted();
#else
  return false;
#endif
}

#if DRAFTSMAN_AMX_BF16
namespace {

namespace simd = draftsman_simd;
using draftsman_attention::key_pairs::transpose_keys;

// e^x for x <= 0, 16 lanes, to the precision of the bf16 it is rounded to: 2^n e^r with
// n = round(x log2 e), r = x - n ln 2 (two-part ln 2, simd_math.h), e^r by its degree-4
// Taylor polynomial on |r| <= ln2 / 2 (relative error < 5e-5, bf16's step is 4e-3), scaled
// by vscalefps. Below -87.3 (a -inf bias included) the result is 0.
inline __m512 exp_for_bf16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(simd::EXP_LO), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(simd::EXP_LO));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(simd::LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-simd::LN2_HI), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-simd::LN2_LO), r);
  __m512 p = _mm512_set1_ps(simd::P[4]);
  for (int i = 3; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(simd::P[i]));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

constexpr int64_t TILE = 16;        // query rows, keys or value dims per tile
constexpr int64_t KEY_STEP = 64;    // keys scored per pass: four score tiles
constexpr int64_t ROWS_PER_TASK = AMX_ROWS_PER_TASK;

// every tile register 16 rows of 64 bytes: A 16 x 32 bf16, B 16 VNNI pairs x 16 columns,
// C 16 x 16 fp32
void configure_tiles() {
  draftsman_amx::TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// a per-thread scratch that only grows (no allocation or page faults per call)
template <typename T>
T* scratch(std::vector<T>& buf, int64_t n) {
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// Values in VNNI pairs for B of P V: for key chunk t (32 keys) and dim tile c (16 dims), a
// 1 KB tile whose row r interleaves keys 32t + 2r and 32t + 2r + 1 over the 16 dims. Keys at
// and past s are zero.
void interleave_values(const uint16_t* v, int64_t stride, int64_t s, int64_t s_pad, int64_t dtiles,
                       uint16_t* vv) {
  __m512i idx;
  {
    alignas(64) uint16_t order[32];
    for (int e = 0; e < 16; ++e) {
      order[2 * e] = static_cast<uint16_t>(e);
      order[2 * e + 1] = static_cast<uint16_t>(32 + e);
    }
    idx = _mm512_load_si512(order);
  }
  for (int64_t t = 0; t < s_pad / 32; ++t) {
    for (int r = 0; r < 16; ++r) {
      const int64_t j = 32 * t + 2 * r;
      for (int64_t c = 0; c < dtiles; ++c) {
        const __m256i a = j < s ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + j * stride + 16 * c))
                                : _mm256_setzero_si256();
        const __m256i b = j + 1 < s
                              ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + (j + 1) * stride + 16 * c))
                              : _mm256_setzero_si256();
        const __m512i pair = _mm512_permutex2var_epi16(_mm512_castsi256_si512(a), idx, _mm512_castsi256_si512(b));
        _mm512_store_si512(vv + ((t * dtiles + c) * 16 + r) * 32, pair);
      }
    }
  }
}

// S[16 qt .. 16 qt + 16)[0 .. s_pad) = Q K^T for one tile of query rows, four key blocks a
// pass (tmm0-3 their sums, tmm4 A, tmm5/6 B)
void score_tile(const uint16_t* qrows, int64_t d, const uint32_t* kt, int64_t s_pad, float* s_out) {
  const int64_t chunks = d / 32;
  for (int64_t kb = 0; kb < s_pad / TILE; kb += 4) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < chunks; ++c) {
      _tile_loadd(4, qrows + 32 * c, d * 2);
      _tile_loadd(5, kt + ((kb + 0) * chunks + c) * 256, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, kt + ((kb + 1) * chunks + c) * 256, 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(5, kt + ((kb + 2) * chunks + c) * 256, 64);
      _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(6, kt + ((kb + 3) * chunks + c) * 256, 64);
      _tile_dpbf16ps(3, 4, 6);
    }
    _tile_stored(0, s_out + (kb + 0) * TILE, s_pad * 4);
    _tile_stored(1, s_out + (kb + 1) * TILE, s_pad * 4);
    _tile_stored(2, s_out + (kb + 2) * TILE, s_pad * 4);
    _tile_stored(3, s_out + (kb + 3) * TILE, s_pad * 4);
  }
}

// O[16 rows][d] = P V for one tile of query rows, four dim tiles a pass
void weigh_tile(const uint16_t* prows, int64_t s_pad, const uint16_t* vv, int64_t dtiles, float* o) {
  for (int64_t c = 0; c < dtiles; c += 4) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t t = 0; t < s_pad / 32; ++t) {
      _tile_loadd(4, prows + 32 * t, s_pad * 2);
      _tile_loadd(5, vv + ((t * dtiles + c + 0) * 16) * 32, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, vv + ((t * dtiles + c + 1) * 16) * 32, 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(5, vv + ((t * dtiles + c + 2) * 16) * 32, 64);
      _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(6, vv + ((t * dtiles + c + 3) * 16) * 32, 64);
      _tile_dpbf16ps(3, 4, 6);
    }
    _tile_stored(0, o + (c + 0) * TILE, dtiles * TILE * 4);
    _tile_stored(1, o + (c + 1) * TILE, dtiles * TILE * 4);
    _tile_stored(2, o + (c + 2) * TILE, dtiles * TILE * 4);
    _tile_stored(3, o + (c + 3) * TILE, dtiles * TILE * 4);
  }
}

// One query row's softmax numerators: p_j = exp(score_j scale + bias_j - max) for j < s,
// rounded to bf16 into prow (zeros from s to s_pad); returns the sum of the rounded p_j.
float softmax_row(float* row, int64_t s, int64_t s_pad, float scale, const float* bias, uint16_t* prow) {
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j < s; j += 16) {
    const __mmask16 live = s - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (s - j)) - 1);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, row + j), sc);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(live, bias + j));
    v = _mm512_mask_blend_ps(live, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), v);
    _mm512_storeu_ps(row + j, v);
    top = _mm512_max_ps(top, v);
  }
  const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  __m512 total = _mm512_setzero_ps();
  for (j = 0; j < s_pad; j += 16) {
    // past s: -inf scores, exp 0
    const __m512 p = j < s ? exp_for_bf16(_mm512_sub_ps(_mm512_loadu_ps(row + j), shift)) : _mm512_setzero_ps();
    const __m256bh pb = _mm512_cvtneps_pbh(p);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(prow + j), (__m256i)pb);
    total = _mm512_add_ps(total, _mm512_cvtpbh_ps(pb));
  }
  return _mm512_reduce_add_ps(total);
}

}  // namespace

void attend_amx(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                const c10::optional<at::Tensor>& bias, float scale, at::Tensor& out,
                const std::function<void(int64_t, int64_t)>& head_prologue) {
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = keys.size(1), s = keys.size(2), group = hq / hkv;
  // keys padded to whole passes of four score tiles (so also to P V's chunks of 32)
  const int64_t s_pad = (s + KEY_STEP - 1) / KEY_STEP * KEY_STEP, dtiles = d / TILE;
  const int64_t chunks = (t + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  const int64_t bias_b = bias && bias->size(0) > 1 ? bias->stride(0) : 0;
  const int64_t bias_t = bias ? bias->stride(2) : 0;
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<c10::BFloat16>());
  const auto* kp = reinterpret_cast<const uint16_t*>(keys.data_ptr<c10::BFloat16>());
  const auto* vp = reinterpret_cast<const uint16_t*>(values.data_ptr<c10::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  at::parallel_for(0, b * hkv * chunks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<uint32_t> kbuf;
    thread_local std::vector<uint16_t> vbuf, qbuf, pbuf;
    thread_local std::vector<float> sbuf, obuf, ibuf;
    configure_tiles();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / (hkv * chunks), g = (task / chunks) % hkv;
      const int64_t r0 = (task % chunks) * ROWS_PER_TASK, rows = std::min(ROWS_PER_TASK, t - r0);
      if (head_prologue) head_prologue(bi, g);
      const int64_t n = rows * group, n_pad = (n + TILE - 1) / TILE * TILE;  // query rows
      // 64-byte aligned scratch (tile stores and aligned vector stores)
      uint32_t* kt = scratch(kbuf, s_pad * d / 2 + 16);
      kt += (64 - reinterpret_cast<uintptr_t>(kt) % 64) % 64 / 4;
      uint16_t* vv = scratch(vbuf, s_pad * d + 32);
      vv += (64 - reinterpret_cast<uintptr_t>(vv) % 64) % 64 / 2;
      uint16_t* qb = scratch(qbuf, n_pad * d);
      uint16_t* pb = scratch(pbuf, n_pad * s_pad);
      float* sb = scratch(sbuf, n_pad * s_pad);
      float* ob = scratch(obuf, n_pad * d);
      const uint16_t* kb = kp + bi * keys.stride(0) + g * keys.stride(1);
      const uint16_t* vb = vp + bi * values.stride(0) + g * values.stride(1);
      transpose_keys(reinterpret_cast<const uint32_t*>(kb), keys.stride(2) / 2, s, s_pad, d / 32, kt);
      interleave_values(vb, values.stride(2), s, s_pad, dtiles, vv);
      for (int64_t i = 0; i < n_pad; ++i) {  // query row i: new row r0 + i / group, head g group + i % group
        uint16_t* dst = qb + i * d;
        if (i < n) {
          const int64_t ti = r0 + i / group, h = g * group + i % group;
          std::memcpy(dst, qp + bi * q.stride(0) + h * q.stride(1) + ti * q.stride(2), 2 * d);
        } else {
          std::memset(dst, 0, 2 * d);
          std::memset(pb + i * s_pad, 0, 2 * s_pad);
        }
      }
      for (int64_t qt = 0; qt < n_pad / TILE; ++qt) score_tile(qb + qt * TILE * d, d, kt, s_pad, sb + qt * TILE * s_pad);
      float* inv = scratch(ibuf, n);
      for (int64_t i = 0; i < n; ++i) {
        const float* br = bp ? bp + bi * bias_b + (r0 + i / group) * bias_t : nullptr;
        inv[i] = 1.f / softmax_row(sb + i * s_pad, s, s_pad, scale, br, pb + i * s_pad);
      }
      for (int64_t qt = 0; qt < n_pad / TILE; ++qt) weigh_tile(pb + qt * TILE * s_pad, s_pad, vv, dtiles, ob + qt * TILE * d);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t ti = r0 + i / group, h = g * group + i % group;
        uint16_t* orow = op + (bi * t + ti) * hq * d + h * d;
        const __m512 f = _mm512_set1_ps(inv[i]);
        for (int64_t e = 0; e < d; e += 16) {
          const __m256bh o = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(ob + i * d + e), f));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(orow + e), (__m256i)o);
        }
      }
    }
    _tile_release();
  });
}
#else
void attend_amx(const at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                float, at::Tensor&, const std::function<void(int64_t, int64_t)>&) {}
#endif

}  // namespace draftsman_attention

// Whether short attention of bf16 rows runs on AMX-BF16 tiles here (for Python's reports).
extern "C" int draftsman_attention_amx() { return draftsman_attention::amx_attention_available() ? 1 : 0; }
