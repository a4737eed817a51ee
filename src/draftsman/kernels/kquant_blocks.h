// What the K-quant kernels share: the GGUF block constants and the int8 activation blocks
// every path multiplies against (kernels/gguf_matmul.cpp, kernels/gguf_matmul_amx.cpp).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace draftsman_kquant {

constexpr int QK = 256;  // weights per super-block
constexpr int Q4K_BYTES = 144;
constexpr int Q6K_BYTES = 210;
constexpr int64_t TYPE_Q4_K = 12;  // GGML type numbers
constexpr int64_t TYPE_Q6_K = 14;

// One 256-wide block of an activation row quantised to int8: x ~= d * q.
struct Q8Block {
  float d;
  int8_t q[QK];
  int16_t bsums[QK / 16];  // sums of q over each 16 elements
  int16_t psums[QK / 32];  // sums of q over each 32 elements
};

inline float half_to_float(uint16_t h) {
  // IEEE binary16 -> binary32, subnormals included
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float read_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

inline void quantize_row(const float* x, int64_t k, Q8Block* out) {
  for (int64_t b = 0; b < k / QK; ++b) {
    const float* xb = x + b * QK;
    float amax = 0.f;
    for (int i = 0; i < QK; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    Q8Block& o = out[b];
    o.d = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int i = 0; i < QK; ++i) {
      o.q[i] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
    }
    for (int s = 0; s < QK / 16; ++s) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += o.q[16 * s + i];
      o.bsums[s] = static_cast<int16_t>(sum);
    }
    for (int s = 0; s < QK / 32; ++s) o.psums[s] = o.bsums[2 * s] + o.bsums[2 * s + 1];
  }
}

// The 6-bit (scale, min) pair of Q4_K sub-block j.
inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q6_K element e (0..255) of one block, as 0..63.
inline int q6k_value(const uint8_t* w, int e) {
  const int half = e / 128, r = e % 128, chunk = r / 32, l = r % 32;
  const uint8_t* ql = w + 64 * half;
  const uint8_t* qh = w + 128 + 32 * half;
  // chunk 0: ql[l] low, 1: ql[l+32] low, 2: ql[l] high, 3: ql[l+32] high
  const uint8_t lb = ql[l + 32 * (chunk % 2)];
  const int lo4 = chunk < 2 ? (lb & 15) : (lb >> 4);
  const int hi2 = (qh[l] >> (2 * chunk)) & 3;
  return lo4 | (hi2 << 4);
}

// Every row of x [M, K] (float32 or bfloat16) as K / 256 Q8Blocks, rows one after another.
// Each row is quantised on its own: the blocks of a row never depend on the other rows.
inline std::vector<Q8Block> quantize_rows(const at::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1), nb = k / QK;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  std::vector<Q8Block> xq(static_cast<size_t>(m * nb));
  at::parallel_for(0, m, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = begin; r < end; ++r) {
      if (bf16) {
        const c10::BFloat16* xr = x.data_ptr<c10::BFloat16>() + r * k;
        for (int64_t i = 0; i < k; ++i) row[i] = static_cast<float>(xr[i]);
      } else {
        std::memcpy(row.data(), x.data_ptr<float>() + r * k, sizeof(float) * k);
      }
      quantize_row(row.data(), k, xq.data() + r * nb);
    }
  });
  return xq;
}

}  // namespace draftsman_kquant
