// Repacks K-quant (and Q8_0) weight rows, and int8 rows, into records (kquant_records.h), once
// at load.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "check_message.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "kquant_records.h"
#include "kquant_blocks.h"

namespace {

using namespace draftsman_kquant;
using namespace draftsman_amx;

void pack_q4k(const uint8_t* blk, int c, uint8_t* rec) {
  std::memcpy(rec + OFF_D + 2 * c, blk, 2);
  std::memcpy(rec + OFF_DMIN + 2 * c, blk + 2, 2);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    q4k_scale_min(blk + 4, j, &sc, &m);
    rec[OFF_SC + COLS * j + c] = static_cast<uint8_t>(sc);
    rec[OFF_MIN + 2 * COLS * (j / 2) + 2 * c + j % 2] = static_cast<uint8_t>(m);
  }
  // byte (p, r, c, i) is the block's byte 32p + 4r + i: 4 bytes at a time
  for (int p = 0; p < 4; ++p) {
    for (int r = 0; r < 8; ++r) std::memcpy(rec + OFF_Q + 512 * p + 64 * r + 4 * c, blk + 16 + 32 * p + 4 * r, 4);
  }
}

// Each record byte written once from the block's values (element 16j + t of sub-block j,
// t = 4r + i): QL byte (p, r, c, i) holds sub-block 2p's low 4 bits and 2p + 1's above them,
// QH byte (u, r, c, i) the top 2 bits of sub-blocks 4u .. 4u + 3 at bits 2s, 2s + 1.
void pack_q6k(const uint8_t* blk, int c, uint8_t* rec) {
  std::memcpy(rec + Q6_OFF_D + 2 * c, blk + 208, 2);
  for (int j = 0; j < 16; ++j) rec[Q6_OFF_SC + COLS * j + c] = blk[192 + j];
  uint8_t q[256];
  q6k_values(blk, q);
  for (int p = 0; p < 8; ++p) {
    for (int t = 0; t < 16; ++t) {
      rec[Q6_OFF_QL + 256 * p + 64 * (t / 4) + 4 * c + t % 4] =
          static_cast<uint8_t>((q[32 * p + t] & 15) | ((q[32 * p + 16 + t] & 15) << 4));
    }
  }
  for (int u = 0; u < 4; ++u) {
    for (int t = 0; t < 16; ++t) {
      const uint8_t* e = q + 64 * u + t;
      rec[Q6_OFF_QH + 256 * u + 64 * (t / 4) + 4 * c + t % 4] =
          static_cast<uint8_t>((e[0] >> 4) | ((e[16] >> 4) << 2) | ((e[32] >> 4) << 4) | ((e[48] >> 4) << 6));
    }
  }
}

// Where weight e (0..255) of column c sits in an 8-bit record's weights (Q8_0's and int8
// rows' layout): block e / 32, k-row (e % 32) / 4, byte e % 4.
inline int byte_index(int e, int c) { return 512 * (e / 32) + 64 * ((e % 32) / 4) + 4 * c + e % 4; }

// An int8 weight as the records store it: q + 128 (vpdpbusd takes unsigned bytes).
inline uint8_t offset_byte(int8_t q) { return static_cast<uint8_t>(q ^ 0x80); }

// Q8_0 blocks j = 0..count-1 of a record (each 32 wide: d f16, 32 int8 q) from `blk`
void pack_q8_0(const uint8_t* blk, int count, int c, uint8_t* rec) {
  for (int j = 0; j < count; ++j, blk += Q8_0_BYTES) {
    std::memcpy(rec + Q8_OFF_D + 2 * (COLS * j + c), blk, 2);
    for (int e = 0; e < 32; ++e) {
      rec[Q8_OFF_Q + byte_index(32 * j + e, c)] = offset_byte(static_cast<int8_t>(blk[2 + e]));
    }
  }
}

// A [rows, cols] byte tensor, zeroed, that Linux backs with 2 MiB pages where it allows
// (transparent huge pages in "madvise" or "always" mode; elsewhere plain pages, the same
// tensor). A decode step streams ~1 GB of records: on 4 KiB pages every 1.7 records cross a
// page and the weight prefetcher pays a page walk, and the hardware prefetchers stop at each
// page; 16 rows of 8960 x 1536 Q4_K from memory measured 1016-1196 -> 935-949 cycles a
// record (one thread, an Emerald Rapids core), one row 505-570 -> 430-504. Matrices under
// 2 MiB take plain pages (rounding them up would cost more memory than they gain).
// `zeroed` false: the bytes are left as the kernel hands out fresh pages (zeros too, but
// without a second pass over them), for a caller that overwrites them all at once.
at::Tensor on_huge_pages(int64_t rows, int64_t cols, bool zeroed) {
  constexpr size_t HUGE_PAGE = size_t{1} << 21;
  const size_t bytes = static_cast<size_t>(rows * cols);
  if (bytes < HUGE_PAGE) return at::zeros({rows, cols}, at::kByte);
  const size_t length = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
  void* p = std::aligned_alloc(HUGE_PAGE, length);
  if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__)
  madvise(p, length, MADV_HUGEPAGE);  // advice before the first touch; refused: plain pages
#endif
  if (zeroed) std::memset(p, 0, bytes);
  return at::from_blob(p, {rows, cols}, [](void* q) { std::free(q); }, at::TensorOptions().dtype(at::kByte));
}

// The bytes of one group of records: nb records, the last one half where the width ends
// within HALF_K of its start (kquant_records.h).
inline int64_t group_bytes(int64_t qtype, int64_t k, int64_t nb) {
  const bool half = half_record_bytes(qtype) > 0 && k - (nb - 1) * QK <= HALF_K;
  return (nb - 1) * record_bytes(qtype) + (half ? half_record_bytes(qtype) : record_bytes(qtype));
}

// Record b of a group is written by `fill(rec)` into zeroed `rec_bytes`; a half last record
// keeps its first bytes only (the header and the first half of the weights come first).
template <typename F>
void write_records(uint8_t* group, int64_t nb, int rec_bytes, int64_t bytes, F&& fill) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* rec = group + b * rec_bytes;
    const int64_t keep = std::min<int64_t>(rec_bytes, bytes - b * rec_bytes);
    if (keep == rec_bytes) {
      fill(b, rec);
    } else {
      std::vector<uint8_t> whole(static_cast<size_t>(rec_bytes), 0);
      fill(b, whole.data());
      std::memcpy(rec, whole.data(), static_cast<size_t>(keep));
    }
  }
}

// k: the matrix's width (-1: all its blocks'); k - its blocks' width is zero padding
at::Tensor kquant_pack_records(const at::Tensor& w, int64_t qtype, int64_t k) {
  TORCH_CHECK(qtype == TYPE_Q4_K || qtype == TYPE_Q6_K || qtype == TYPE_Q8_0,
              "kquant_pack_records: qtype must be Q4_K, Q6_K or Q8_0");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(),
              "kquant_pack_records: w must be a contiguous uint8 [N, bytes] tensor of K-quant rows");
  const int64_t block = qtype == TYPE_Q4_K ? Q4K_BYTES : qtype == TYPE_Q6_K ? Q6K_BYTES : Q8_0_BYTES;
  TORCH_CHECK(w.size(1) % block == 0,
              draftsman_msg::text("kquant_pack_records: rows of ", w.size(1), " bytes are not whole blocks"));
  // Q8_0: 8 blocks of 32 a record, the last record's missing blocks zero (d = 0)
  const int per_record = qtype == TYPE_Q8_0 ? QK / 32 : 1;
  const int64_t blocks = w.size(1) / block, nb = (blocks + per_record - 1) / per_record;
  const int64_t width = blocks * (QK / per_record);
  if (k < 0) k = width;
  TORCH_CHECK(k <= width && k > width - QK / per_record,
              draftsman_msg::text("kquant_pack_records: width ", k, " does not end in the last of ", blocks, " blocks"));
  const int64_t n = w.size(0), groups = (n + COLS - 1) / COLS;
  const int rec_bytes = record_bytes(qtype);
  const int64_t bytes = group_bytes(qtype, k, nb);
  // padded columns stay zero: d = dmin = 0, so they compute 0 and are never written out
  at::Tensor out = on_huge_pages(groups, bytes, true);
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      write_records(dst + g * bytes, nb, rec_bytes, bytes, [&](int64_t b, uint8_t* rec) {
        for (int c = 0; c < COLS && g * COLS + c < n; ++c) {
          const uint8_t* blk = src + (g * COLS + c) * w.size(1) + b * per_record * block;
          if (qtype == TYPE_Q4_K) {
            pack_q4k(blk, c, rec);
          } else if (qtype == TYPE_Q6_K) {
            pack_q6k(blk, c, rec);
          } else {
            pack_q8_0(blk, static_cast<int>(std::min<int64_t>(per_record, blocks - b * per_record)), c, rec);
          }
        }
      });
    }
  });
  return out;
}

// int8 rows q [N, K] with one float32 scale each as records of 16 rows (kquant_records.h),
// K padded to whole records with q = 0 (a half last record where K ends within its first 128).
at::Tensor int8_pack_records(const at::Tensor& q, const at::Tensor& scale) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous(),
              "int8_pack_records: q must be a contiguous int8 [N, K] tensor");
  TORCH_CHECK(scale.dim() == 1 && scale.scalar_type() == at::kFloat && scale.size(0) == q.size(0) &&
                  scale.is_contiguous(),
              "int8_pack_records: scale must be a contiguous float32 [N] tensor");
  const int64_t n = q.size(0), k = q.size(1), nb = (k + QK - 1) / QK, groups = (n + COLS - 1) / COLS;
  const int64_t bytes = group_bytes(TYPE_I8_ROW, k, nb);
  at::Tensor out = on_huge_pages(groups, bytes, true);
  const int8_t* src = q.data_ptr<int8_t>();
  const float* d = scale.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      write_records(dst + g * bytes, nb, I8_RECORD, bytes, [&](int64_t b, uint8_t* rec) {
        for (int c = 0; c < COLS && g * COLS + c < n; ++c) {
          const int8_t* row = src + (g * COLS + c) * k;
          std::memcpy(rec + I8_OFF_D + 4 * c, d + g * COLS + c, 4);
          for (int e = 0; e < QK; ++e) {
            const int64_t at = b * QK + e;
            rec[I8_OFF_Q + byte_index(e, c)] = offset_byte(at < k ? row[at] : 0);
          }
        }
      });
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftsman, m) {
  m.def("kquant_pack_records(Tensor w, int qtype, int k=-1) -> Tensor");
  m.def("int8_pack_records(Tensor q, Tensor scale) -> Tensor");
  // no tensor argument to dispatch on: one kernel for every backend (models/packed_cache.py
  // reads cached records into it)
  m.def("on_huge_pages(int rows, int cols, bool zeroed) -> Tensor", &on_huge_pages);
}

TORCH_LIBRARY_IMPL(draftsman, CPU, m) {
  m.impl("kquant_pack_records", &kquant_pack_records);
  m.impl("int8_pack_records", &int8_pack_records);
}
