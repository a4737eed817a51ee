// A row's greedy token as Tensor.argmax(-1) defines it (the first index of the maximum, a NaN
// counting as the maximum: the first NaN where a row has one), found 16 values at a time as
// they go by: over stored logits (greedy_rows.cpp) or over a head's sums as the records
// kernel makes them, so that a greedy verify never stores its logits
// (kquant_records_greedy, gguf_matmul_records.cpp).
//
// Each of 16 lanes keeps the largest value it has seen and where it first saw it (a strictly
// greater value replaces it), and where it first saw a NaN. A run of values is summed up as a
// Pick; picks of disjoint runs merge into the pick of their union, in any order: a NaN's least
// index wins, else the largest value at its least index. So threads may split a row's columns
// freely and the token is the same alone, in a batch or on any thread count.
#pragma once

#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace draftsman_greedy {

// What a run of a row's values decides: its first NaN (or none), else its largest value and
// the least index holding it
struct Pick {
  static constexpr int64_t NONE = std::numeric_limits<int64_t>::max();
  float value = -std::numeric_limits<float>::infinity();
  int64_t index = NONE;
  int64_t nan = NONE;

  void merge(const Pick& o) {
    if (o.nan < nan) nan = o.nan;
    if (o.value > value || (o.value == value && o.index < index)) value = o.value, index = o.index;
  }
  // the token: the first NaN, else the first maximum (index 0 for a row of -inf only)
  int64_t token() const { return nan != NONE ? nan : index == NONE ? 0 : index; }
};

#if defined(__AVX512F__)
struct Lanes {
  __m512 top;
  __m512i at;     // where each lane first saw its top
  __m512i nan_at;  // where each lane first saw a NaN (NONE32: not yet)
  static constexpr int32_t NONE32 = std::numeric_limits<int32_t>::max();

  // lanes before any value, for a run starting at `first`: every lane -inf at first + lane,
  // so a run of -inf alone picks its first index
  void start(int64_t first) {
    top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    at = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(first)),
                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    nan_at = _mm512_set1_epi32(NONE32);
  }

  // x: the values of indices index .. index + 15 (lanes past a row's end hold -inf)
  void take(__m512 x, __m512i index) {
    const __mmask16 greater = _mm512_cmp_ps_mask(x, top, _CMP_GT_OQ);
    top = _mm512_mask_mov_ps(top, greater, x);
    at = _mm512_mask_mov_epi32(at, greater, index);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    if (nan) nan_at = _mm512_mask_min_epi32(nan_at, nan, nan_at, index);
  }

  Pick pick() const {
    Pick p;
    const int32_t first_nan = _mm512_reduce_min_epi32(nan_at);
    if (first_nan != NONE32) p.nan = first_nan;
    p.value = _mm512_reduce_max_ps(top);
    const __mmask16 holds = _mm512_cmp_ps_mask(top, _mm512_set1_ps(p.value), _CMP_EQ_OQ);
    p.index = holds ? _mm512_mask_reduce_min_epi32(holds, at) : Pick::NONE;
    return p;
  }
};
#endif

}  // namespace draftsman_greedy
