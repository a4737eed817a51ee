// greedy_rows: the greedy token of every row of logits [..., V] (float32 or bfloat16), as
// Tensor.argmax(-1) defines it: the first index of the maximum, a NaN counting as the maximum
// (the first NaN where a row has one). What a greedy verify reads of a target's logits: a
// verify's 16 rows of 151,936 bf16 took ~1.6 ms through PyTorch's max(-1) after a forward on
// an AMX Xeon, a row ~0.17 ms.
//
// One pass a row through greedy_lanes.h's lanes. Rows are independent: the same answer alone
// or in a batch, on any thread count.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "greedy_lanes.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define DRAFTSMAN_GREEDY_VECTORS 1
#else
#define DRAFTSMAN_GREEDY_VECTORS 0
#endif

namespace {

inline float value(const float* row, int64_t i) { return row[i]; }
inline float value(const c10::BFloat16* row, int64_t i) { return static_cast<float>(row[i]); }

// The rule itself, one element at a time: the build without AVX-512.
template <typename T>
int64_t greedy_scalar(const T* row, int64_t v) {
  int64_t best = 0;
  float top = value(row, 0);
  if (std::isnan(top)) return 0;
  for (int64_t i = 1; i < v; ++i) {
    const float x = value(row, i);
    if (std::isnan(x)) return i;
    if (x > top) top = x, best = i;
  }
  return best;
}

#if DRAFTSMAN_GREEDY_VECTORS
// 16 values from p as floats; lanes at or past `count` read as -inf (never a maximum there
// unless the whole row is -inf, and then index 0 wins)
inline __m512 load16(const float* p, int count) {
  const __mmask16 k = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  return _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), k, p);
}
inline __m512 load16(const c10::BFloat16* p, int count) {
  const __mmask16 k = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  const __m256i h = _mm256_maskz_loadu_epi16(k, p);
  const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), k, x);
}

template <typename T>
int64_t greedy_row(const T* row, int64_t v) {
  draftsman_greedy::Lanes lanes;
  lanes.start(0);
  __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < v; i += 16) {
    lanes.take(load16(row + i, static_cast<int>(v - i < 16 ? v - i : 16)), index);
    index = _mm512_add_epi32(index, step);
  }
  return lanes.pick().token();
}
#else
template <typename T>
int64_t greedy_row(const T* row, int64_t v) {
  return greedy_scalar(row, v);
}
#endif

at::Tensor greedy_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() >= 1 && logits.is_contiguous() && logits.size(-1) > 0,
              "greedy_rows: logits must be a contiguous [..., V] tensor with V > 0");
  const bool bf16 = logits.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || logits.scalar_type() == at::kFloat, "greedy_rows: float32 or bfloat16 only");
  TORCH_CHECK(logits.size(-1) <= std::numeric_limits<int32_t>::max(), "greedy_rows: V must fit int32");
  const int64_t v = logits.size(-1), rows = logits.numel() / v;
  at::Tensor out = at::empty(logits.sizes().slice(0, logits.dim() - 1), logits.options().dtype(at::kLong));
  int64_t* got = out.data_ptr<int64_t>();
  // a row a task: one row (a decode step's pick) stays on the calling thread
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      got[r] = bf16 ? greedy_row(logits.data_ptr<c10::BFloat16>() + r * v, v)
                    : greedy_row(logits.data_ptr<float>() + r * v, v);
    }
  });
  return out;
}

}  // namespace

// Whether greedy_rows runs its AVX-512 pass here (else the one-element loop, which PyTorch's
// max(-1) beats: kernels/greedy.py's greedy_tokens then takes max)
extern "C" int draftsman_greedy_rows_vectors() { return DRAFTSMAN_GREEDY_VECTORS; }

TORCH_LIBRARY_FRAGMENT(draftsman, m) { m.def("greedy_rows(Tensor logits) -> Tensor"); }

TORCH_LIBRARY_IMPL(draftsman, CPU, m) { m.impl("greedy_rows", &greedy_rows); }
