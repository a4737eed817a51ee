// Attention of a few new rows against the KV cache, each one call:
//   short_attention softmax(q k^T * scale + bias) v for a few new rows against the cache
//   rope_attention  RoPE on q and k, k and v stored in the cache, then short_attention
//
// Invariant (batch invariance): every output row depends on its own query row, the cache and
// its bias row only, computed in the same order whatever the number of rows or threads.
// Exact decoding methods on these kernels therefore emit their own autoregressive tokens.
// They need not match PyTorch's own operators bit for bit (summation order and exp differ
// in the last float bits), only themselves.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_amx.h"
#include "attention_bf16.h"
#include "simd_math.h"

namespace {

using namespace draftsman_simd;

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

// ---- the AVX-512 path: up to 16 new rows of a KV head share each key and value read ----
//
// A task is (batch, KV head, up to MAX_ROWS_PER_TASK new rows): its keys (transposed) and
// values are widened to float once and every query row of the task (group x rows) is scored
// against them. A score is one chain of d fmas in order over the head dimension, 16 keys a
// vector (no sum across lanes: with keys row by row, 16 lane sums and a tree per score cost
// as much as the products; 16 rows at 272 slots, one thread, the whole attention 250 -> 200 us), whatever
// the key's place (the last 16 padded with zero keys) and whatever the other rows; a value
// sum runs over the slots in order per lane. So the invariant above holds on this path too; its results differ from
// the 8-wide path's in the last bits (another summation order), so a build uses one of them
// for a head size.
#if DRAFTSMAN_AVX512_OPS  // AVX-512 F and BW (simd_math.h)
#define DRAFTSMAN_AVX512 1
constexpr int64_t MAX_ROWS_PER_TASK = 16;

// New rows per task: as few chunks of rows as keep every thread busy, since each chunk widens
// its head's keys and values again (16 rows, 2 KV heads, 2 threads: one chunk of 16 a head,
// not two of 8), and at most MAX_ROWS_PER_TASK rows each (a prompt's scores stay in L2).
inline int64_t rows_per_task(int64_t t, int64_t heads) {
  const int64_t wanted = std::max<int64_t>(1, (at::get_num_threads() + heads - 1) / heads);
  const int64_t chunks = std::max((t + MAX_ROWS_PER_TASK - 1) / MAX_ROWS_PER_TASK, std::min(wanted, t));
  return (t + chunks - 1) / chunks;
}

// 16 x 16 floats transposed in registers: r[i] lane j <- r[j] lane i (4 rounds of shuffles)
inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    for (int h = 0; h < 2; ++h) {
      r[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + h]), _mm512_castps_pd(t[i + 2 + h])));
      r[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + h]), _mm512_castps_pd(t[i + 2 + h])));
    }
  }
  for (int i = 0; i < 16; i += 8) {
    for (int h = 0; h < 4; ++h) {
      t[i + h] = _mm512_shuffle_f32x4(r[i + h], r[i + 4 + h], 0x88);
      t[i + 4 + h] = _mm512_shuffle_f32x4(r[i + h], r[i + 4 + h], 0xDD);
    }
  }
  for (int h = 0; h < 8; ++h) {
    r[h] = _mm512_shuffle_f32x4(t[h], t[8 + h], 0x88);
    r[8 + h] = _mm512_shuffle_f32x4(t[h], t[8 + h], 0xDD);
  }
}

// keys [s x d] (rows kstride apart; d a multiple of 16) as floats transposed, kt [d x s16]
// (s16 = s rounded up to 16, the padded keys zero): a score block is then 16 keys of one
// query row in one vector, with no sum across lanes
template <typename T>
void transposed_keys(const T* k, int64_t kstride, int64_t s, int64_t d, float* kt, int64_t s16) {
  for (int64_t j0 = 0; j0 < s16; j0 += 16) {
    for (int64_t e0 = 0; e0 < d; e0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = j0 + i < s ? load16(k + (j0 + i) * kstride + e0) : _mm512_setzero_ps();
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(kt + (e0 + i) * s16 + j0, r[i]);
    }
  }
}

// sc[i][j] = q_i . k_j for R query rows from q (rows d apart) and 16 V keys from j0 of kt:
// each score a chain of d fmas in order over the head dimension, whatever R, V or j0, so a
// row's scores are the same alone or among others
template <int R, int V>
inline void scores_block(const float* q, int64_t d, const float* kt, int64_t s16, int64_t j0, float* sc) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t e = 0; e < d; ++e) {
    __m512 kv[V];
    for (int v = 0; v < V; ++v) kv[v] = _mm512_loadu_ps(kt + e * s16 + j0 + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 qe = _mm512_set1_ps(q[r * d + e]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(qe, kv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(sc + r * s16 + j0 + 16 * v, acc[r][v]);
  }
}

// sc[i][j] = q_i . k_j for query rows q [n x d] against kt [d x s16], one block of keys at
// a time for every row (64 keys: d x 64 floats of kt, 32 KiB at d = 128, stay in L1 while
// all rows pass them; row by row over all keys, each 4 rows streamed kt's 139 KiB from L2:
// 16 new rows, 272 slots, 6 query heads a KV head, one thread's scores 116k -> 93k reference
// cycles, the whole attention ~87 -> ~79 us on 2 threads, a Zen 5 EPYC): 4 rows x 64 keys a
// block (16 accumulators, each key vector loaded once for 4 rows), the last rows 2 or 1 at
// a time (a group of 6 query heads: 4 + 2), then the last keys 16 at a time
template <int V>
void scores_keys(const float* q, int64_t n, const float* kt, int64_t s16, int64_t d, int64_t j0, float* sc) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) scores_block<4, V>(q + i * d, d, kt, s16, j0, sc + i * s16);
  for (; i + 2 <= n; i += 2) scores_block<2, V>(q + i * d, d, kt, s16, j0, sc + i * s16);
  for (; i < n; ++i) scores_block<1, V>(q + i * d, d, kt, s16, j0, sc + i * s16);
}

void scores_wide(const float* q, int64_t n, const float* kt, int64_t s16, int64_t d, float* sc) {
  int64_t j0 = 0;
  for (; j0 + 64 <= s16; j0 += 64) scores_keys<4>(q, n, kt, s16, d, j0, sc);
  for (; j0 < s16; j0 += 16) scores_keys<1>(q, n, kt, s16, d, j0, sc);
}

// out[r] = sum_j p[r][j] v_j for R rows (p rows p_stride apart, out rows d apart), v [s x d]
// floats (d a multiple of 64), 64 columns at a time: 4R accumulators, each value vector
// loaded once for all R rows
template <int R>
void weigh_values_wide(const float* p, int64_t p_stride, const float* v, int64_t s, int64_t d,
                       float* out) {
  for (int64_t c = 0; c < d; c += 64) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps();
    for (int64_t j = 0; j < s; ++j) {
      const float* vj = v + j * d + c;
      const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
      const __m512 v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
      for (int r = 0; r < R; ++r) {
        const __m512 pj = _mm512_set1_ps(p[r * p_stride + j]);
        acc[r][0] = _mm512_fmadd_ps(pj, v0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(pj, v1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(pj, v2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(pj, v3, acc[r][3]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int w = 0; w < 4; ++w) _mm512_storeu_ps(out + r * d + c + 16 * w, acc[r][w]);
    }
  }
}

// A score row's softmax numerators in place: + bias, then e^(x - max) over its s slots, 16
// lanes at a time. A scalar max and sum over the slots are chains of dependent 4-cycle
// operations (~1,100 cycles a row at 272 slots, as long as the row's products): the max is
// exact in any order, and exp16 gives exp_scalar's bits, so only the sum (sum_in_lanes)
// takes another, still fixed, order.
void softmax_numerators(float* row, const float* bias, int64_t s) {
  __m512 top16 = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 16 <= s; j += 16) {
    __m512 v = _mm512_loadu_ps(row + j);
    if (bias) _mm512_storeu_ps(row + j, v = _mm512_add_ps(v, _mm512_loadu_ps(bias + j)));
    top16 = _mm512_max_ps(top16, v);
  }
  float top = _mm512_reduce_max_ps(top16);
  for (; j < s; ++j) {
    if (bias) row[j] += bias[j];
    top = std::fmax(top, row[j]);
  }
  const __m512 shift = _mm512_set1_ps(top);
  for (j = 0; j + 16 <= s; j += 16) _mm512_storeu_ps(row + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(row + j), shift)));
  for (; j < s; ++j) row[j] = exp_scalar(row[j] - top);
}

// the sum of s floats: 16 lane sums over the slots in order, the tail into lane order, then
// one fixed tree over the lanes (the same for every row, whatever the other rows)
float sum_in_lanes(const float* row, int64_t s) {
  __m512 lanes = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= s; j += 16) lanes = _mm512_add_ps(lanes, _mm512_loadu_ps(row + j));
  if (j < s) lanes = _mm512_add_ps(lanes, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (s - j)) - 1), row + j));
  alignas(64) float part[16];
  _mm512_store_ps(part, lanes);
  for (int w = 8; w >= 1; w /= 2) {
    for (int k = 0; k < w; ++k) part[k] += part[k + w];
  }
  return part[0];
}

// a per-thread scratch that only grows (no allocation, page faults or zeroing per call)
// 64-byte aligned: the vector loads of keys, values and scores then never straddle two cache
// lines (a straddling load costs two; with malloc's 16-byte alignment one thread's 16-row
// scores took 175k reference cycles against the other's 93k, the attention 108 -> 87 us)
template <typename E>
E* scratch(std::vector<E>& buf, int64_t n) {
  static_assert(sizeof(E) == 4, "16 elements of padding make 64 bytes");
  if (static_cast<int64_t>(buf.size()) < n + 16) buf.resize(static_cast<size_t>(n + 16));
  return reinterpret_cast<E*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
}

// Whether attend_wide gives each task all t new rows of its KV head (one chunk a head): then a
// task may write its head's new keys and values itself (rope_attention's per-head prologue).
inline bool one_task_a_head(int64_t t, int64_t heads) { return rows_per_task(t, heads) >= t; }

// `head_prologue(bi, g)`, where given, runs at the start of task (bi, g) before it reads q, the
// keys or the values; only with one task a head (one_task_a_head).
template <typename T, typename Prologue = std::nullptr_t>
void attend_wide(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                 const c10::optional<at::Tensor>& bias, float scale, at::Tensor& out,
                 const Prologue& head_prologue = nullptr) {
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = keys.size(1), s = keys.size(2), group = hq / hkv;
  // bf16 rows: scores on AVX512-BF16 pairs where the CPU has them (attention_bf16.cpp), keys
  // padded to its passes of 64; else fp32 scores, keys padded to 16
  bool pairs = false;
  if constexpr (std::is_same_v<T, c10::BFloat16>) pairs = draftsman_attention::bf16_pairs_attention_available();
  const int64_t step = pairs ? draftsman_attention::KEY_PAIRS_STEP : 16;
  const int64_t s_pad = (s + step - 1) / step * step, per_task = rows_per_task(t, b * hkv);
  const int64_t chunks = (t + per_task - 1) / per_task;
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  const int64_t bias_b = bias && bias->size(0) > 1 ? bias->stride(0) : 0;
  const int64_t bias_t = bias ? bias->stride(2) : 0;
  T* op = out.data_ptr<T>();
  at::parallel_for(0, b * hkv * chunks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> kbuf, vbuf, qbuf, sbuf, abuf;
    thread_local std::vector<uint32_t> kpairs, qpairs;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / (hkv * chunks), g = (task / chunks) % hkv;
      const int64_t r0 = (task % chunks) * per_task, rows = std::min(per_task, t - r0);
      if constexpr (!std::is_same_v<Prologue, std::nullptr_t>) head_prologue(bi, g);
      const int64_t n = rows * group;  // query rows: (new row, head in the group)
      float* vf = scratch(vbuf, s * d);
      float* sc = scratch(sbuf, n * s_pad);
      float* acc = scratch(abuf, n * d);
      const T* kb = keys.data_ptr<T>() + bi * keys.stride(0) + g * keys.stride(1);
      const T* vb = values.data_ptr<T>() + bi * values.stride(0) + g * values.stride(1);
      const auto query_row = [&](int64_t i) {  // (new row, head in the group)
        const int64_t ti = r0 + i / group, h = g * group + i % group;
        return q.data_ptr<T>() + bi * q.stride(0) + h * q.stride(1) + ti * q.stride(2);
      };
      if (pairs) {  // bf16 rows only: their d dims are d / 2 dwords of pairs
        uint32_t* q32 = scratch(qpairs, n * d / 2);
        for (int64_t i = 0; i < n; ++i) std::memcpy(q32 + i * d / 2, query_row(i), 2 * d);
        draftsman_attention::bf16_pair_scores(reinterpret_cast<const uint16_t*>(kb), keys.stride(2), s, s_pad, d, q32,
                                              n, scale, scratch(kpairs, s_pad * d / 2), sc);
      } else {
        float* kf = scratch(kbuf, s_pad * d);
        float* qf = scratch(qbuf, n * d);
        transposed_keys(kb, keys.stride(2), s, d, kf, s_pad);
        for (int64_t i = 0; i < n; ++i) {
          const T* qr = query_row(i);
          for (int64_t e = 0; e < d; e += 16) _mm512_storeu_ps(qf + i * d + e, _mm512_mul_ps(load16(qr + e), _mm512_set1_ps(scale)));
        }
        scores_wide(qf, n, kf, s_pad, d, sc);
      }
      for (int64_t j = 0; j < s; ++j) to_floats(vb + j * values.stride(2), d, vf + j * d);
      for (int64_t i = 0; i < n; ++i) {
        const float* br = bp ? bp + bi * bias_b + (r0 + i / group) * bias_t : nullptr;
        softmax_numerators(sc + i * s_pad, br, s);
      }
      int64_t i = 0;
      for (; i + 6 <= n; i += 6) weigh_values_wide<6>(sc + i * s_pad, s_pad, vf, s, d, acc + i * d);
      for (; i + 2 <= n; i += 2) weigh_values_wide<2>(sc + i * s_pad, s_pad, vf, s, d, acc + i * d);
      for (; i < n; ++i) weigh_values_wide<1>(sc + i * s_pad, s_pad, vf, s, d, acc + i * d);
      for (int64_t r = 0; r < n; ++r) {
        const __m512 inv = _mm512_set1_ps(1.f / sum_in_lanes(sc + r * s_pad, s));
        const int64_t ti = r0 + r / group, h = g * group + r % group;
        T* orow = op + (bi * t + ti) * hq * d + h * d;
        for (int64_t e = 0; e < d; e += 16) store16(orow + e, round16(_mm512_mul_ps(_mm512_loadu_ps(acc + r * d + e), inv), orow));
      }
    }
  });
}
#else
#define DRAFTSMAN_AVX512 0
#endif

// Whether bf16 rows of head size d attend on AMX tiles here (attend_best's first choice).
template <typename T>
bool attends_on_amx(int64_t d) {
  return std::is_same_v<T, c10::BFloat16> && d % 64 == 0 && draftsman_attention::amx_attention_available();
}

// the attention this build runs for a head size: AMX tiles (attends_on_amx), else the AVX-512
// path where the CPU has it and the head size is a multiple of 64, the 8-wide one elsewhere
template <typename T>
void attend_best(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                 const c10::optional<at::Tensor>& bias, float scale, at::Tensor& out) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (attends_on_amx<T>(q.size(3))) return draftsman_attention::attend_amx(q, keys, values, bias, scale, out);
  }
#if DRAFTSMAN_AVX512
  if (q.size(3) % 64 == 0) return attend_wide<T>(q, keys, values, bias, scale, out);
#endif
  attend<T>(q, keys, values, bias, scale, out);
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
    attend_best<c10::BFloat16>(q, keys, values, bias, static_cast<float>(scale), out);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "short_attention: float32 or bfloat16 only");
    attend_best<float>(q, keys, values, bias, static_cast<float>(scale), out);
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
  int64_t i = 0;
#if DRAFTSMAN_AVX512
  if (half % 16 == 0) {  // the same products, roundings and sums, 16 at a time
    for (; i < d; i += 16) {
      const __m512 swapped = load16(x + (i < half ? i + half : i - half));
      const __m512 a = round16(_mm512_mul_ps(load16(x + i), load16(cos + i)), out);
      const __m512 b = round16(_mm512_mul_ps(swapped, load16(sin + i)), out);
      store16(out + i, round16(_mm512_add_ps(a, b), out));
    }
  }
#endif
#if DRAFTSMAN_AVX2
  if (half % 8 == 0) {  // the same products, roundings and sums, 8 at a time
    for (; i < d; i += 8) {
      const __m256 swapped = load8(x + (i < half ? i + half : i - half));
      const __m256 a = round_avx2(_mm256_mul_ps(load8(x + i), load8(cos + i)), out);
      const __m256 b = round_avx2(_mm256_mul_ps(swapped, load8(sin + i)), out);
      store8(out + i, round_avx2(_mm256_add_ps(a, b), out));
    }
  }
#endif
  for (; i < d; ++i) {
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
  // q and k heads rotated (q into a fresh [B, Hq, T, D], k into its cache slot), v copied:
  // row r's heads from h0 to h1 (q heads) and KV heads g0 to g1
  const auto rotate_row = [&](int64_t r, int64_t h0, int64_t h1, int64_t g0, int64_t g1) {
    const int64_t bi = r / t, ti = r % t;
    const T* row = src + r * width;
    const T* c = cp + r * d;
    const T* sn = sp + r * d;
    for (int64_t h = h0; h < h1; ++h) rotate(row + h * d, c, sn, d, qp + ((bi * nq + h) * t + ti) * d);
    for (int64_t h = g0; h < g1; ++h) {
      const int64_t slot = bi * k_cache.stride(0) + h * k_cache.stride(1) + (start + ti) * k_cache.stride(2);
      rotate(row + (nq + h) * d, c, sn, d, kc + slot);
      std::memcpy(vc + bi * v_cache.stride(0) + h * v_cache.stride(1) + (start + ti) * v_cache.stride(2),
                  row + (nq + nkv + h) * d, sizeof(T) * d);
    }
  };
  const at::Tensor keys = k_cache.narrow(2, 0, start + t);
  const at::Tensor values = v_cache.narrow(2, 0, start + t);
  at::Tensor out = at::empty({b, t, nq * d}, qkv.options());
#if DRAFTSMAN_AVX512
  // Where every attention task holds all new rows of one KV head, the task rotates and writes
  // that head's rows itself (its q heads, its key and value): one parallel region a layer
  // instead of two (a verify's 16 rows, 2 KV heads, 2 threads), the same bits. First where
  // attend_best would take attend_wide (no AMX tiles for these rows), then on the tiles.
  const int64_t group = nq / nkv;
  const auto head_prologue = [&](int64_t bi, int64_t g) {
    for (int64_t ti = 0; ti < t; ++ti) rotate_row(bi * t + ti, g * group, (g + 1) * group, g, g + 1);
  };
  if (d % 64 == 0 && !attends_on_amx<T>(d) && one_task_a_head(t, b * nkv)) {
    attend_wide<T>(q, keys, values, bias, static_cast<float>(scale), out, head_prologue);
    return out;
  }
  // The same on AMX tiles, where a task holds all new rows of its KV head (the 0.5B's 16 rows:
  // 42.5 against 44.1 us a layer, level; bench-results/amx-q8-registers)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (attends_on_amx<T>(d) && t <= draftsman_attention::AMX_ROWS_PER_TASK) {
      draftsman_attention::attend_amx(q, keys, values, bias, static_cast<float>(scale), out, head_prologue);
      return out;
    }
  }
#endif
  at::parallel_for(0, b * t, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rotate_row(r, 0, nq, 0, nkv);
  });
  attend_best<T>(q, keys, values, bias, static_cast<float>(scale), out);
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
  m.def("short_attention(Tensor q, Tensor keys, Tensor values, Tensor? bias, float scale) -> Tensor");
  m.def("rope_attention(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "int start, Tensor? bias, float scale, int n_heads, int n_kv) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftsman, CPU, m) {
  m.impl("short_attention", &short_attention);
  m.impl("rope_attention", &rope_attention);
}
