// Conversions between float rows and GGUF blocks, once at load:
//   dequantize_blocks  a GGUF's blocks -> float32 rows, as gguf-py's numpy decoders compute
//                      them bit for bit (the same float products and sums; -ffp-contract=off),
//                      ~20x faster: q8 and q4-draft requantise from these
//   quantize_q4k       float rows -> Q4_K blocks for the `q4-draft` weight format
//                      (models/weight_formats.py), which runs a draft's wider blocks (Q5_0,
//                      Q8_0, Q6_K, F16) on the K-quant kernel at about half of int8's bytes
//
// quantize_q4k: per sub-block of 32 weights x ~ s q + b (q in 0..15, b <= 0): s and b start
// from the sub-block's range and are refitted twice by least squares on the rounded q. Per
// block of 256, the eight s and -b become 6-bit multiples of two fp16 steps d and dmin, and
// q is rounded once more against what the block stores: w = d sc_j q - dmin m_j.
// A row shorter than a multiple of 256 is padded with zero weights (sc = m = q = 0, exactly
// zero), so the caller pads the activations with zeros to the same width.
// Deterministic: every block depends on its own 256 weights only.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "check_message.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kquant_blocks.h"

namespace {

constexpr int QK = 256, SUB = 32, BLOCK_BYTES = 144;

struct Fit {
  float step, offset;  // x ~ step * q + offset, offset <= 0
};

int level(float x, float offset, float step) {
  if (!(step > 0.f)) return 0;
  return static_cast<int>(std::clamp(std::nearbyint((x - offset) / step), 0.f, 15.f));
}

Fit fit_sub_block(const float* x) {
  float lo = 0.f, hi = x[0];
  for (int i = 0; i < SUB; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  Fit f{(hi - lo) / 15.f, lo};
  for (int round = 0; round < 2; ++round) {
    double sq = 0, sx = 0, sqq = 0, sqx = 0;
    for (int i = 0; i < SUB; ++i) {
      const double q = level(x[i], f.offset, f.step);
      sq += q;
      sx += x[i];
      sqq += q * q;
      sqx += q * x[i];
    }
    const double den = SUB * sqq - sq * sq;
    if (den <= 0) break;
    const double step = (SUB * sqx - sq * sx) / den, offset = (sx - step * sq) / SUB;
    if (step > 0 && offset <= 0) {
      f = {static_cast<float>(step), static_cast<float>(offset)};
    } else if (sqq > 0 && sqx > 0) {  // the best fit has offset > 0: keep offset 0
      f = {static_cast<float>(sqx / sqq), 0.f};
    }
  }
  return f;
}

void quantize_block(const float* x, uint8_t* out) {
  Fit fits[8];
  float top_step = 0.f, top_min = 0.f;
  for (int j = 0; j < 8; ++j) {
    fits[j] = fit_sub_block(x + SUB * j);
    top_step = std::max(top_step, fits[j].step);
    top_min = std::max(top_min, -fits[j].offset);
  }
  const c10::Half dh(top_step / 63.f), mh(top_min / 63.f);
  const float d = static_cast<float>(dh), dmin = static_cast<float>(mh);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0.f ? static_cast<uint8_t>(std::clamp(std::nearbyint(fits[j].step / d), 0.f, 63.f)) : 0;
    m[j] = dmin > 0.f ? static_cast<uint8_t>(std::clamp(std::nearbyint(-fits[j].offset / dmin), 0.f, 63.f)) : 0;
  }
  std::memcpy(out, &dh, 2);
  std::memcpy(out + 2, &mh, 2);
  for (int i = 0; i < 4; ++i) {  // the 12 scale bytes as kquant_blocks.h's q4k_scale_min reads them
    out[4 + i] = static_cast<uint8_t>(sc[i] | ((sc[4 + i] >> 4) << 6));
    out[8 + i] = static_cast<uint8_t>(m[i] | ((m[4 + i] >> 4) << 6));
    out[12 + i] = static_cast<uint8_t>((sc[4 + i] & 15) | ((m[4 + i] & 15) << 4));
  }
  // run p holds sub-block 2p in its low nibbles and 2p + 1 in its high ones
  for (int p = 0; p < 4; ++p) {
    for (int l = 0; l < SUB; ++l) {
      int q[2];
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * p + h;
        q[h] = level(x[SUB * j + l], -dmin * m[j], d * sc[j]);
      }
      out[16 + SUB * p + l] = static_cast<uint8_t>(q[0] | (q[1] << 4));
    }
  }
}

// ---- dequantize_blocks ----

float half(const uint8_t* p) {
  c10::Half h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(h);
}

// One block of `n` weights into out, per GGML type (gguf-py's formulas, operation by operation)
void dequantize_block(int64_t qtype, const uint8_t* b, float* out) {
  using namespace draftsman_kquant;
  switch (qtype) {
    case 2: {  // Q4_0: d (q - 8)
      const float d = half(b);
      for (int j = 0; j < 16; ++j) {
        out[j] = d * static_cast<float>((b[2 + j] & 15) - 8);
        out[j + 16] = d * static_cast<float>((b[2 + j] >> 4) - 8);
      }
      return;
    }
    case 3: {  // Q4_1: d q + m
      const float d = half(b), m = half(b + 2);
      for (int j = 0; j < 16; ++j) {
        out[j] = d * static_cast<float>(b[4 + j] & 15) + m;
        out[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
      }
      return;
    }
    case 6:
    case 7: {  // Q5_0: d (q - 16); Q5_1: d q + m; bit 4 of weight j is bit j of qh
      const bool q51 = qtype == 7;
      const float d = half(b), m = q51 ? half(b + 2) : 0.f;
      const uint8_t* qh = b + (q51 ? 4 : 2);
      const uint8_t* qs = qh + 4;
      uint32_t bits;
      std::memcpy(&bits, qh, 4);
      for (int j = 0; j < 16; ++j) {
        const int lo = (qs[j] & 15) | (((bits >> j) & 1) << 4);
        const int hi = (qs[j] >> 4) | (((bits >> (j + 16)) & 1) << 4);
        if (q51) {
          out[j] = d * static_cast<float>(lo) + m;
          out[j + 16] = d * static_cast<float>(hi) + m;
        } else {
          out[j] = d * static_cast<float>(lo - 16);
          out[j + 16] = d * static_cast<float>(hi - 16);
        }
      }
      return;
    }
    case 8: {  // Q8_0: q d
      const float d = half(b);
      for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
      return;
    }
    case 12:
    case 13: {  // Q4_K / Q5_K: (d sc_j) q - (dmin m_j)
      const bool q5 = qtype == 13;
      const float d = half(b), dmin = half(b + 2);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (q5 ? 48 : 16);
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        q4k_scale_min(b + 4, j, &sc, &m);
        const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) {
          int q = j % 2 ? qs[32 * (j / 2) + l] >> 4 : qs[32 * (j / 2) + l] & 15;
          if (q5) q |= ((qh[l] >> j) & 1) << 4;
          out[32 * j + l] = ds * static_cast<float>(q) - dm;
        }
      }
      return;
    }
    case 14: {  // Q6_K: (d sc_j) (q - 32) per 16 weights
      const float d = half(b + 208);
      for (int e = 0; e < 256; ++e) {
        const float ds = d * static_cast<float>(static_cast<int8_t>(b[192 + e / 16]));
        out[e] = ds * static_cast<float>(q6k_value(b, e) - 32);
      }
      return;
    }
    default:
      TORCH_CHECK(false, draftsman_msg::text("dequantize_blocks: GGML type ", qtype, " is not decoded here"));
  }
}

int64_t block_size(int64_t qtype) { return qtype >= 10 ? 256 : 32; }

int64_t block_bytes(int64_t qtype) {
  switch (qtype) {
    case 2: return 18;
    case 3: return 20;
    case 6: return 22;
    case 7: return 24;
    case 8: return 34;
    case 12: return 144;
    case 13: return 176;
    case 14: return 210;
    default: return 0;
  }
}

at::Tensor dequantize_blocks(const at::Tensor& rows, int64_t qtype, int64_t k) {
  const int64_t bytes = block_bytes(qtype), size = block_size(qtype);
  TORCH_CHECK(bytes > 0, draftsman_msg::text("dequantize_blocks: GGML type ", qtype, " is not decoded here"));
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kByte && rows.is_contiguous() &&
                  k % size == 0 && rows.size(1) == k / size * bytes,
              draftsman_msg::text("dequantize_blocks: rows must be a contiguous uint8 [N, K / ", size, " * ", bytes, "]"));
  const int64_t n = rows.size(0), nb = k / size;
  at::Tensor out = at::empty({n, k}, rows.options().dtype(at::kFloat));
  const uint8_t* src = rows.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, n * nb, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dequantize_block(qtype, src + i * bytes, dst + i * size);
  });
  return out;
}

// ---- quantize_q4k ----

at::Tensor quantize_q4k(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.is_contiguous(),
              "quantize_q4k: w must be a contiguous float32 [N, K] tensor");
  const int64_t n = w.size(0), k = w.size(1), nb = (k + QK - 1) / QK;
  at::Tensor out = at::empty({n, nb * BLOCK_BYTES}, w.options().dtype(at::kByte));
  const float* wp = w.data_ptr<float>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    float block[QK];
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t from = b * QK, count = std::min<int64_t>(QK, k - from);
        std::memcpy(block, wp + r * k + from, sizeof(float) * count);
        std::fill(block + count, block + QK, 0.f);
        quantize_block(block, op + (r * nb + b) * BLOCK_BYTES);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftsman, m) {
  m.def("quantize_q4k(Tensor w) -> Tensor");
  m.def("dequantize_blocks(Tensor rows, int qtype, int k) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftsman, CPU, m) {
  m.impl("quantize_q4k", &quantize_q4k);
  m.impl("dequantize_blocks", &dequantize_blocks);
}
