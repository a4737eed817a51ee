// The small operations between the matrix products of a decode step, each one call.
//
// A 1.5B decode step on the CPU runs ~40 small PyTorch operators per layer around its
// matrix products (casts, copies, reductions, views), ~14 ms of a ~64 ms step on a 2-core
// AVX2 EPYC; each of these kernels replaces several of them:
//   rms_norm        y = w * bf16(x * rsqrt(mean(x^2) + eps))   (the reference's roundings)
//   add_rms_norm    s = x + delta (a residual add), y = rms_norm(s): both, in one pass
//   silu_mul        y = silu(gate) * up over the halves of a fused gate/up row
// and the attention (kernels/attention_ops.cpp).
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
#include <tuple>
#include <vector>

#include "simd_math.h"

namespace {

using namespace draftsman_simd;

// ---- rms_norm ----

// The sum of squares of a row in one fixed order, the same for every row count and CPU:
// PARTS partial sums, part l over the elements l, l + PARTS, l + 2 PARTS, ... in order (one
// fma each), then one tree over the parts. PARTS chains instead of one keep the fma's
// latency off the row's time (AVX-512: 4 vectors, AVX2: 8; with the 16-lane passes below, 16
// rows of 1536 take 6.9 us a call where one 8-lane chain took 10.7, 57 calls a 1.5B verify).
constexpr int PARTS = 64;

template <typename T>
float sum_of_squares(const T* x, int64_t h) {
  alignas(64) float part[PARTS] = {};
  int64_t i = 0;
#if DRAFTSMAN_AVX512_OPS
  {
    __m512 acc[PARTS / 16];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (; i + PARTS <= h; i += PARTS) {
      for (int v = 0; v < PARTS / 16; ++v) {
        const __m512 e = load16(x + i + 16 * v);
        acc[v] = _mm512_fmadd_ps(e, e, acc[v]);
      }
    }
    for (int v = 0; v < PARTS / 16; ++v) _mm512_store_ps(part + 16 * v, acc[v]);
  }
#elif DRAFTSMAN_AVX2
  {
    __m256 acc[PARTS / 8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (; i + PARTS <= h; i += PARTS) {
      for (int v = 0; v < PARTS / 8; ++v) {
        const __m256 e = load8(x + i + 8 * v);
        acc[v] = _mm256_fmadd_ps(e, e, acc[v]);
      }
    }
    for (int v = 0; v < PARTS / 8; ++v) _mm256_store_ps(part + 8 * v, acc[v]);
  }
#endif
  for (; i < h; ++i) part[i % PARTS] = std::fma(to_float(x[i]), to_float(x[i]), part[i % PARTS]);
  for (int w = PARTS / 2; w >= 1; w /= 2) {
    for (int k = 0; k < w; ++k) part[k] += part[k + w];
  }
  return part[0];
}

template <typename T>
void rms_norm_row(const T* x, const T* w, int64_t h, float eps, T* y) {
  const float rstd = 1.f / std::sqrt(sum_of_squares(x, h) / static_cast<float>(h) + eps);
  // normalised in float32 and stored in the activation dtype, then scaled in it: the
  // scalar loop's roundings, 16 or 8 at a time
  int64_t j = 0;
#if DRAFTSMAN_AVX512_OPS
  for (; j + 16 <= h; j += 16) {
    const __m512 normed = round16(_mm512_mul_ps(load16(x + j), _mm512_set1_ps(rstd)), y);
    store16(y + j, round16(_mm512_mul_ps(load16(w + j), normed), y));
  }
#endif
#if DRAFTSMAN_AVX2
  for (; j + 8 <= h; j += 8) {
    const __m256 normed = round_avx2(_mm256_mul_ps(load8(x + j), _mm256_set1_ps(rstd)), y);
    store8(y + j, round_avx2(_mm256_mul_ps(load8(w + j), normed), y));
  }
#endif
  for (; j < h; ++j) y[j] = T(to_float(w[j]) * round_to<T>(to_float(x[j]) * rstd));
}

// The norms' weight [H] in x's dtype, float32 or bfloat16, or a one-line error naming `op`;
// whether x is bfloat16.
bool checked_norm_weight(const char* op, const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous() &&
                  weight.scalar_type() == x.scalar_type(),
              op, ": weight must be [H] in x's dtype");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || x.scalar_type() == at::kFloat, op, ": float32 or bfloat16 only");
  return bf16;
}

// Rows a thread takes at least: a verify's 16 rows of 1536 (~3 us on one thread) finish
// before a second thread would have started (~2.5 us on a 2-core KVM EPYC); a prompt's rows
// are shared out.
inline int64_t norm_grain(int64_t h) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(h, 1)); }

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "rms_norm: x must be a contiguous [M, H]");
  const bool bf16 = checked_norm_weight("rms_norm", x, weight);
  const int64_t m = x.size(0), h = x.size(1);
  at::Tensor y = at::empty_like(x);
  at::parallel_for(0, m, norm_grain(h), [&](int64_t begin, int64_t end) {
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

// ---- add_rms_norm ----

// s = x + delta rounded to the activation dtype (as PyTorch's add rounds: the float sum, to
// nearest even), then y = rms_norm_row(s): a block's residual add and the next norm in one
// call over the row (the separate bf16 add cost 8 us a call at 16 rows of 1536)
template <typename T>
void add_rms_norm_row(const T* x, const T* delta, const T* w, int64_t h, float eps, T* s, T* y) {
  int64_t i = 0;
#if DRAFTSMAN_AVX512_OPS
  for (; i + 16 <= h; i += 16) store16(s + i, round16(_mm512_add_ps(load16(x + i), load16(delta + i)), s));
#endif
#if DRAFTSMAN_AVX2
  for (; i + 8 <= h; i += 8) store8(s + i, round_avx2(_mm256_add_ps(load8(x + i), load8(delta + i)), s));
#endif
  for (; i < h; ++i) s[i] = T(to_float(x[i]) + to_float(delta[i]));
  rms_norm_row(s, w, h, eps, y);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && delta.sizes() == x.sizes() && delta.is_contiguous() &&
                  delta.scalar_type() == x.scalar_type(),
              "add_rms_norm: x and delta must be contiguous [M, H] of one dtype");
  const bool bf16 = checked_norm_weight("add_rms_norm", x, weight);
  const int64_t m = x.size(0), h = x.size(1);
  at::Tensor sum = at::empty_like(x), y = at::empty_like(x);
  at::parallel_for(0, m, norm_grain(h), [&](int64_t begin, int64_t end) {  // as rms_norm
    for (int64_t r = begin; r < end; ++r) {
      if (bf16) {
        add_rms_norm_row(x.data_ptr<c10::BFloat16>() + r * h, delta.data_ptr<c10::BFloat16>() + r * h,
                         weight.data_ptr<c10::BFloat16>(), h, static_cast<float>(eps),
                         sum.data_ptr<c10::BFloat16>() + r * h, y.data_ptr<c10::BFloat16>() + r * h);
      } else {
        add_rms_norm_row(x.data_ptr<float>() + r * h, delta.data_ptr<float>() + r * h, weight.data_ptr<float>(), h,
                         static_cast<float>(eps), sum.data_ptr<float>() + r * h, y.data_ptr<float>() + r * h);
      }
    }
  });
  return {sum, y};
}

// ---- silu_mul ----

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftsman, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(draftsman, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("add_rms_norm", &add_rms_norm);
}
