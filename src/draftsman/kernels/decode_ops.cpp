// The small operations between the matrix products of a decode step, each one call.
//
// A 1.5B decode step on the CPU runs ~40 small PyTorch operators per layer around its
// matrix products (casts, copies, reductions, views), ~14 ms of a ~64 ms step on a 2-core
// AVX2 EPYC; each of these kernels replaces several of them:
//   rms_norm        y = w * bf16(x * rsqrt(mean(x^2) + eps))   (the reference's roundings)
//   silu_mul        y = silu(gate) * up over the halves of a fused gate/up row
//   short_attention softmax(q k^T * scale + bias) v for a few new rows against the cache
//   rope_attention  RoPE on q and k, k and v stored in the cache, then short_attention
//
// Invariant (batch invariance): every output row depends on its own input row (and, for
// attention, its own query row, the cache and its bias row) only, computed in the same order
// whatever the number of rows or threads. Exact decoding methods on these kernels therefore
// emit their own autoregressive tokens. They need not match PyTorch's own operators bit for
// bit (summation order and exp differ in the last float bits), only themselves.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DRAFTSMAN_AVX2 1
#else
#define DRAFTSMAN_AVX2 0
#endif

namespace {

// ---- exp: one polynomial, scalar and 8-wide, the same operations in the same order ----
//
// e^x = 2^n e^r with n = round(x log2 e), r = x - n ln 2 (two-part ln 2), e^r by a degree-6
// Taylor polynomial on |r| <= ln2 / 2 (relative error < 2e-7). Below -87.3 the result is 0
// (so a -inf bias masks exactly); above 88 it saturates at e^88.
constexpr float EXP_HI = 88.f;
constexpr float EXP_LO = -87.3f;
constexpr float LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693359375f;
constexpr float LN2_LO = -2.12194440e-4f;
constexpr float P[7] = {1.f, 1.f, 0.5f, 1.f / 6, 1.f / 24, 1.f / 120, 1.f / 720};

float exp_scalar(float x) {
  if (!(x >= EXP_LO)) return 0.f;  // also -inf and NaN-free masks
  x = std::fmin(x, EXP_HI);
  const float n = std::nearbyint(x * LOG2E);
  float r = std::fma(n, -LN2_HI, x);
  r = std::fma(n, -LN2_LO, r);
  float p = P[6];
  for (int i = 5; i >= 0; --i) p = std::fma(p, r, P[i]);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

#if DRAFTSMAN_AVX2
__m256 exp_avx2(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
  __m256 p = _mm256_set1_ps(P[6]);
  for (int i = 5; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P[i]));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

__m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__m256 load8(const c10::BFloat16* p) {
  // bf16 -> f32 is the 16 bits moved to the top half of the word
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// float -> the nearest bf16 (ties to even), still as a float: what T(v) stores for T = bf16
// (NaN aside: never produced by these kernels from finite inputs)
__m256 round_bf16_avx2(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
  return _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(~0xffff)));
}

__m256 round_avx2(__m256 v, const float*) { return v; }
__m256 round_avx2(__m256 v, const c10::BFloat16*) { return round_bf16_avx2(v); }

void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
void store8(c10::BFloat16* p, __m256 v) {
  // v holds bf16 values already (low 16 bits zero): keep the high halves
  const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

float to_float(float v) { return v; }
float to_float(c10::BFloat16 v) { return static_cast<float>(v); }

// the value as the activation dtype stores it (bf16: rounded to nearest even)
template <typename T>
float round_to(float v) {
  return static_cast<float>(T(v));
}

// ---- rms_norm ----

template <typename T>
void rms_norm_row(const T* x, const T* w, int64_t h, float eps, T* y) {
  // 8 partial sums in a fixed order: the same for every row count and CPU
  float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= h; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const float v = to_float(x[i + l]);
      part[l] = std::fma(v, v, part[l]);
    }
  }
  for (; i < h; ++i) part[i % 8] = std::fma(to_float(x[i]), to_float(x[i]), part[i % 8]);
  const float sum = ((part[0] + part[4]) + (part[1] + part[5])) +
                    ((part[2] + part[6]) + (part[3] + part[7]));
  const float rstd = 1.f / std::sqrt(sum / static_cast<float>(h) + eps);
  for (int64_t j = 0; j < h; ++j) {
    // normalised in float32 and stored in the activation dtype, then scaled in it
    y[j] = T(to_float(w[j]) * round_to<T>(to_float(x[j]) * rstd));
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "rms_norm: x must be a contiguous [M, H]");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous() &&
                  weight.scalar_type() == x.scalar_type(),
              "rms_norm: weight must be [H] in x's dtype");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || x.scalar_type() == at::kFloat, "rms_norm: float32 or bfloat16 only");
  const int64_t m = x.size(0), h = x.size(1);
  at::Tensor y = at::empty_like(x);
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (bf16) {
        rms_norm_row(x.data_ptr<c10::BFloat16>() + r * h, weight.data_ptr<c10::BFloat16>(), h,
                     static_cast<float>(eps), y.data_ptr<c10::BFloat16>() + r * h);
      } else {
        rms_norm_row(x.data_ptr<float>() + r * h, weight.data_ptr<float>(), h,
                     static_cast<float>(eps), y.data_ptr<float>() + r * h);
      }
    }
  });
  return y;
}

// ---- silu_mul ----

template <typename T>
void silu_mul_span(const T* gate, const T* up, int64_t n, T* y) {
  // silu(g) = g / (1 + e^-g), stored in the activation dtype, then times up (as PyTorch's
  // F.silu(gate).mul_(up) rounds); the same exp in both paths below
  int64_t i = 0;
#if DRAFTSMAN_AVX2
  for (; i + 8 <= n; i += 8) {
    const __m256 g = load8(gate + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = round_avx2(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)), y);
    store8(y + i, round_avx2(_mm256_mul_ps(silu, load8(up + i)), y));
  }
#endif
  for (; i < n; ++i) {
    const float g = to_float(gate[i]);
    const float s = g / (1.f + exp_scalar(-g));
    y[i] = T(round_to<T>(s) * to_float(up[i]));
  }
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "silu_mul: gate_up must be a contiguous [M, 2 I]");
  const bool bf16 = gate_up.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || gate_up.scalar_type() == at::kFloat, "silu_mul: float32 or bfloat16 only");
  const int64_t m = gate_up.size(0), inner = gate_up.size(1) / 2;
  at::Tensor y = at::empty({m, inner}, gate_up.options());
  // split every row into column chunks of 1024 (a multiple of 8: a chunk's vector/scalar
  // split is the same as the whole row's), so one row still uses every thread
  constexpr int64_t CHUNK = 1024;
  const int64_t chunks = (inner + CHUNK - 1) / CHUNK;
  at::parallel_for(0, m * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / chunks, c0 = (task % chunks) * CHUNK;
      const int64_t n = std::min(CHUNK, inner - c0);
      if (bf16) {
        const c10::BFloat16* g = gate_up.data_ptr<c10::BFloat16>() + r * 2 * inner + c0;
        silu_mul_span(g, g + inner, n, y.data_ptr<c10::BFloat16>() + r * inner + c0);
      } else {
        const float* g = gate_up.data_ptr<float>() + r * 2 * inner + c0;
        silu_mul_span(g, g + inner, n, y.data_ptr<float>() + r * inner + c0);
      }
    }
  });
  return y;
}

// ---- short_attention ----

void exp_shift(float* s, int64_t n, float shift) {
  int64_t i = 0;
#if DRAFTSMAN_AVX2
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(s + i, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), _mm256_set1_ps(shift))));
  }
#endif
  for (; i < n; ++i) s[i] = exp_scalar(s[i] - shift);
}

template <typename T>
void to_floats(const T* src, int64_t d, float* dst) {
  int64_t i = 0;
#if DRAFTSMAN_AVX2
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(dst + i, load8(src + i));
#endif
  for (; i < d; ++i) dst[i] = to_float(src[i]);
}

// dot(q, k) over d floats (four independent accumulators: the fma latency, not its
// throughput, would bound one chain)
float dot(const float* q, const float* k, int64_t d) {
  int64_t i = 0;
  float sum = 0.f;
#if DRAFTSMAN_AVX2
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  for (; i + 32 <= d; i += 32) {
    for (int a = 0; a < 4; ++a) {
      acc[a] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8 * a), _mm256_loadu_ps(k + i + 8 * a), acc[a]);
    }
  }
  for (; i + 8 <= d; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc[0]);
  sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
#endif
  for (; i < d; ++i) sum = std::fma(q[i], k[i], sum);
  return sum;
}

// out[r][c0..c0+w) = sum_j p[r][j] v[j][c0..c0+w) for R rows at once (v read once for all);
// each row's sum runs over j in order, whatever R
template <int R, typename T>
void weigh_values(const float* const* p, const T* v, int64_t vstride, int64_t s, int64_t d,
                  float* const* out) {
  int64_t c = 0;
#if DRAFTSMAN_AVX2
  for (; c + 16 <= d; c += 16) {  // two column chunks: 2R independent fma chains
    __m256 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < s; ++j) {
      const __m256 v0 = load8(v + j * vstride + c), v1 = load8(v + j * vstride + c + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 pj = _mm256_broadcast_ss(p[r] + j);
        lo[r] = _mm256_fmadd_ps(pj, v0, lo[r]);
        hi[r] = _mm256_fmadd_ps(pj, v1, hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(out[r] + c, lo[r]);
      _mm256_storeu_ps(out[r] + c + 8, hi[r]);
    }
  }
  for (; c + 8 <= d; c += 8) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < s; ++j) {
      const __m256 vj = load8(v + j * vstride + c);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p[r] + j), vj, acc[r]);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + c, acc[r]);
  }
#endif
  for (; c < d; ++c) {
    for (int r = 0; r < R; ++r) {
      float acc = 0.f;
      for (int64_t j = 0; j < s; ++j) acc = std::fma(p[r][j], to_float(v[j * vstride + c]), acc);
      out[r][c] = acc;
    }
  }
}

template <typename T>
void attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
            const c10::optional<at::Tensor>& bias, float scale, at::Tensor& out) {
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = keys.size(1), s = keys.size(2), group = hq / hkv;
  const T* qp = q.data_ptr<T>();
  const T* kp = keys.data_ptr<T>();
  const T* vp = values.data_ptr<T>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  const int64_t bias_b = bias && bias->size(0) > 1 ? bias->stride(0) : 0;
  const int64_t bias_t = bias ? bias->stride(2) : 0;
  T* op = out.data_ptr<T>();
  // One task per (batch, KV head, new row): its `group` query heads share every key and
  // value read. Each query row is still computed on its own, in the same order: scores
  // q.k * scale + bias, softmax over the s cached slots, then the weighted sum of values.
  at::parallel_for(0, b * hkv * t, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(static_cast<size_t>(group * d)), kf(static_cast<size_t>(d));
    std::vector<float> sc(static_cast<size_t>(group * s)), acc(static_cast<size_t>(group * d));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / (hkv * t), g = (task / t) % hkv, ti = task % t;
      for (int64_t i = 0; i < group; ++i) {
        const T* qr = qp + bi * q.stride(0) + (g * group + i) * q.stride(1) + ti * q.stride(2);
        for (int64_t e = 0; e < d; ++e) qf[i * d + e] = to_float(qr[e]) * scale;
      }
      const T* kb = kp + bi * keys.stride(0) + g * keys.stride(1);
      const T* vb = vp + bi * values.stride(0) + g * values.stride(1);
      const float* br = bp ? bp + bi * bias_b + ti * bias_t : nullptr;
      for (int64_t j = 0; j < s; ++j) {
        to_floats(kb + j * keys.stride(2), d, kf.data());
        const float add = br ? br[j] : 0.f;
        for (int64_t i = 0; i < group; ++i) sc[i * s + j] = dot(qf.data() + i * d, kf.data(), d) + add;
      }
      std::vector<const float*> rows(static_cast<size_t>(group));
      std::vector<float*> outs(static_cast<size_t>(group));
      for (int64_t i = 0; i < group; ++i) {
        float* row = sc.data() + i * s;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < s; ++j) top = std::fmax(top, row[j]);
        exp_shift(row, s, top);
        rows[i] = row;
        outs[i] = acc.data() + i * d;
      }
      int64_t i = 0;
      for (; i + 4 <= group; i += 4) weigh_values<4>(&rows[i], vb, values.stride(2), s, d, &outs[i]);
      for (; i + 2 <= group; i += 2) weigh_values<2>(&rows[i], vb, values.stride(2), s, d, &outs[i]);
      for (; i < group; ++i) weigh_values<1>(&rows[i], vb, values.stride(2), s, d, &outs[i]);
      for (int64_t r = 0; r < group; ++r) {
        float total = 0.f;
        for (int64_t j = 0; j < s; ++j) total += rows[r][j];
        const float inv = 1.f / total;
        T* orow = op + (bi * t + ti) * hq * d + (g * group + r) * d;
        for (int64_t e = 0; e < d; ++e) orow[e] = T(acc[r * d + e] * inv);
      }
    }
  });
}

at::Tensor short_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                           const c10::optional<at::Tensor>& bias, double scale) {
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.dim() == 4,
              "short_attention: q [B, Hq, T, D], keys/values [B, Hkv, S, D]");
  TORCH_CHECK(q.stride(3) == 1 && keys.stride(3) == 1 && values.stride(3) == 1,
              "short_attention: the last dimension must be contiguous");
  TORCH_CHECK(keys.sizes() == values.sizes() && keys.size(0) == q.size(0) &&
                  keys.size(3) == q.size(3) && q.size(1) % keys.size(1) == 0,
              "short_attention: shapes do not match");
  TORCH_CHECK(keys.scalar_type() == q.scalar_type() && values.scalar_type() == q.scalar_type(),
              "short_attention: q, keys and values must share a dtype");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 4 &&
                    bias->size(2) == q.size(2) && bias->size(3) == keys.size(2) &&
                    bias->stride(3) == 1,
                "short_attention: bias must be float32 [B or 1, 1, T, S]");
  }
  at::Tensor out = at::empty({q.size(0), q.size(2), q.size(1) * q.size(3)}, q.options());
  if (q.scalar_type() == at::kBFloat16) {
    attend<c10::BFloat16>(q, keys, values, bias, static_cast<float>(scale), out);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "short_attention: float32 or bfloat16 only");
    attend<float>(q, keys, values, bias, static_cast<float>(scale), out);
  }
  return out;
}

// ---- rope_attention: rotate, store in the cache, attend ----

// x rotated by its position's angle as `apply_rotary` (models/rope.py) rounds it: each
// product in the activation dtype, then their sum; sin has its first half negated, so
// out = x * cos + (x2, x1) * sin over the half-split pairs (i, i + D/2).
template <typename T>
void rotate(const T* x, const T* cos, const T* sin, int64_t d, T* out) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < d; ++i) {
    const float swapped = to_float(x[i < half ? i + half : i - half]);
    const float a = round_to<T>(to_float(x[i]) * to_float(cos[i]));
    const float b = round_to<T>(swapped * to_float(sin[i]));
    out[i] = T(a + b);
  }
}

template <typename T>
at::Tensor rope_attention_impl(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                               at::Tensor& k_cache, at::Tensor& v_cache, int64_t start,
                               const c10::optional<at::Tensor>& bias, double scale,
                               int64_t nq, int64_t nkv) {
  const int64_t b = qkv.size(0), t = qkv.size(1), d = k_cache.size(3);
  const int64_t width = (nq + 2 * nkv) * d;
  at::Tensor q = at::empty({b, nq, t, d}, qkv.options());
  const T* src = qkv.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* qp = q.data_ptr<T>();
  T* kc = k_cache.data_ptr<T>();
  T* vc = v_cache.data_ptr<T>();
  // q and k heads rotated (q into a fresh [B, Hq, T, D], k into its cache slot), v copied
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t ti = 0; ti < t; ++ti) {
      const T* row = src + (bi * t + ti) * width;
      const T* c = cp + (bi * t + ti) * d;
      const T* sn = sp + (bi * t + ti) * d;
      for (int64_t h = 0; h < nq; ++h) rotate(row + h * d, c, sn, d, qp + ((bi * nq + h) * t + ti) * d);
      for (int64_t h = 0; h < nkv; ++h) {
        const int64_t slot = bi * k_cache.stride(0) + h * k_cache.stride(1) + (start + ti) * k_cache.stride(2);
        rotate(row + (nq + h) * d, c, sn, d, kc + slot);
        std::memcpy(vc + bi * v_cache.stride(0) + h * v_cache.stride(1) + (start + ti) * v_cache.stride(2),
                    row + (nq + nkv + h) * d, sizeof(T) * d);
      }
    }
  }
  const at::Tensor keys = k_cache.narrow(2, 0, start + t);
  const at::Tensor values = v_cache.narrow(2, 0, start + t);
  at::Tensor out = at::empty({b, t, nq * d}, qkv.options());
  attend<T>(q, keys, values, bias, static_cast<float>(scale), out);
  return out;
}

at::Tensor rope_attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                          at::Tensor k_cache, at::Tensor v_cache, int64_t start,
                          const c10::optional<at::Tensor>& bias, double scale, int64_t n_heads,
                          int64_t n_kv) {
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.stride(3) == 1 && v_cache.stride(3) == 1,
              "rope_attention: caches must be [B, Hkv, S, D] with D contiguous");
  const int64_t d = k_cache.size(3);
  TORCH_CHECK(qkv.dim() == 3 && qkv.is_contiguous() && qkv.size(0) == k_cache.size(0) &&
                  qkv.size(2) == (n_heads + 2 * n_kv) * d && k_cache.size(1) == n_kv &&
                  n_heads % n_kv == 0 && d % 2 == 0,
              "rope_attention: qkv must be a contiguous [B, T, (Hq + 2 Hkv) D]");
  const int64_t b = qkv.size(0), t = qkv.size(1);
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == b * t * d &&
                  sin.numel() == b * t * d,
              "rope_attention: cos/sin must be contiguous [B, T, (1,) D]");
  TORCH_CHECK(start >= 0 && start + t <= k_cache.size(2), "rope_attention: slots out of range");
  TORCH_CHECK(qkv.scalar_type() == k_cache.scalar_type() && cos.scalar_type() == qkv.scalar_type() &&
                  sin.scalar_type() == qkv.scalar_type() && v_cache.scalar_type() == qkv.scalar_type(),
              "rope_attention: one dtype for qkv, cos/sin and the caches");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 4 && bias->size(2) == t &&
                    bias->size(3) == start + t && bias->stride(3) == 1,
                "rope_attention: bias must be float32 [B or 1, 1, T, start + T]");
  }
  if (qkv.scalar_type() == at::kBFloat16) {
    return rope_attention_impl<c10::BFloat16>(qkv, cos, sin, k_cache, v_cache, start, bias, scale,
                                              n_heads, n_kv);
  }
  TORCH_CHECK(qkv.scalar_type() == at::kFloat, "rope_attention: float32 or bfloat16 only");
  return rope_attention_impl<float>(qkv, cos, sin, k_cache, v_cache, start, bias, scale, n_heads,
                                    n_kv);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftsman, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("short_attention(Tensor q, Tensor keys, Tensor values, Tensor? bias, float scale) -> Tensor");
  m.def("rope_attention(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "int start, Tensor? bias, float scale, int n_heads, int n_kv) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftsman, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("short_attention", &short_attention);
  m.impl("rope_attention", &rope_attention);
}
