// How many integer dot products this machine's cores run a second now: `dot_products(rounds)`
// has each of torch's threads run `rounds` steps of 16 independent `vpdpbusd` chains on zmm
// registers (AVX-512 VNNI), nothing else. Timed from Python (profiling.dot_rate), it gives
// the capacity of the two pipes every records product runs on (vpdpbusd, and the float
// multiply-adds of the folds beside them): with the memory stream (stream_probe.cpp) it bounds
// how fast a forward's records can run at n rows.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int CHAINS = 16;  // independent accumulators: past the instruction's latency x pipes

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
// rounds >= 1 steps of CHAINS vpdpbusd of bytes 1 (unsigned) x 1 (signed): each step adds 4 to
// every int32 lane of every chain. Returns the sum of the final lanes (CHAINS x 16 x 4 x rounds)
// so a test can tell that every product ran. In assembly: a compiler may fold or drop
// products of constants, and the count is the point.
int64_t dot_chains(int64_t rounds) {
  alignas(64) uint8_t ones[64];
  std::memset(ones, 1, sizeof(ones));
  alignas(64) int32_t lanes[CHAINS * 16];
  __asm__ volatile(
      "vmovdqu64 (%[ones]), %%zmm16\n\t"
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\tvpxord %%zmm1, %%zmm1, %%zmm1\n\t"
      "vpxord %%zmm2, %%zmm2, %%zmm2\n\tvpxord %%zmm3, %%zmm3, %%zmm3\n\t"
      "vpxord %%zmm4, %%zmm4, %%zmm4\n\tvpxord %%zmm5, %%zmm5, %%zmm5\n\t"
      "vpxord %%zmm6, %%zmm6, %%zmm6\n\tvpxord %%zmm7, %%zmm7, %%zmm7\n\t"
      "vpxord %%zmm8, %%zmm8, %%zmm8\n\tvpxord %%zmm9, %%zmm9, %%zmm9\n\t"
      "vpxord %%zmm10, %%zmm10, %%zmm10\n\tvpxord %%zmm11, %%zmm11, %%zmm11\n\t"
      "vpxord %%zmm12, %%zmm12, %%zmm12\n\tvpxord %%zmm13, %%zmm13, %%zmm13\n\t"
      "vpxord %%zmm14, %%zmm14, %%zmm14\n\tvpxord %%zmm15, %%zmm15, %%zmm15\n\t"
      "1:\n\t"
      "vpdpbusd %%zmm16, %%zmm16, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm16, %%zmm1\n\t"
      "vpdpbusd %%zmm16, %%zmm16, %%zmm2\n\tvpdpbusd %%zmm16, %%zmm16, %%zmm3\n\t"
      "vpdpbusd %%zmm16, %%zmm16, %%zmm4\n\tvpdpbusd %%zmm16, %%zmm16, %%zmm5\n\t"
      "vpdpbusd %%zmm16, %%zmm16, %%zmm6\n\tvpdpbusd %%zmm16, %%zmm16, %%zmm7\n\t"
      "vpdpbusd %%zmm16, %%zmm16, %%zmm8\n\tvpdpbusd %%zmm16, %%zmm16, %%zmm9\n\t"
      "vpdpbusd %%zmm16, %%zmm16, %%zmm10\n\tvpdpbusd %%zmm16, %%zmm16, %%zmm11\n\t"
      "vpdpbusd %%zmm16, %%zmm16, %%zmm12\n\tvpdpbusd %%zmm16, %%zmm16, %%zmm13\n\t"
      "vpdpbusd %%zmm16, %%zmm16, %%zmm14\n\tvpdpbusd %%zmm16, %%zmm16, %%zmm15\n\t"
      "dec %[n]\n\tjnz 1b\n\t"
      "vmovdqu64 %%zmm0, (%[out])\n\tvmovdqu64 %%zmm1, 64(%[out])\n\t"
      "vmovdqu64 %%zmm2, 128(%[out])\n\tvmovdqu64 %%zmm3, 192(%[out])\n\t"
      "vmovdqu64 %%zmm4, 256(%[out])\n\tvmovdqu64 %%zmm5, 320(%[out])\n\t"
      "vmovdqu64 %%zmm6, 384(%[out])\n\tvmovdqu64 %%zmm7, 448(%[out])\n\t"
      "vmovdqu64 %%zmm8, 512(%[out])\n\tvmovdqu64 %%zmm9, 576(%[out])\n\t"
      "vmovdqu64 %%zmm10, 640(%[out])\n\tvmovdqu64 %%zmm11, 704(%[out])\n\t"
      "vmovdqu64 %%zmm12, 768(%[out])\n\tvmovdqu64 %%zmm13, 832(%[out])\n\t"
      "vmovdqu64 %%zmm14, 896(%[out])\n\tvmovdqu64 %%zmm15, 960(%[out])\n\t"
      : [n] "+r"(rounds)
      : [ones] "r"(ones), [out] "r"(lanes)
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
        "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16");
  int64_t sum = 0;
  for (int32_t v : lanes) sum += v;
  return sum;
}
constexpr bool HAS_DOTS = true;
#else
int64_t dot_chains(int64_t) { return 0; }
constexpr bool HAS_DOTS = false;
#endif

// Returns int64 [instructions run over all threads, sum of their final lanes]; [0, 0] where the
// build has no AVX-512 VNNI (the probe measures that path's pipes only).
at::Tensor dot_products(int64_t rounds) {
  TORCH_CHECK(rounds >= 1, "dot_products: rounds must be >= 1");
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> part(static_cast<size_t>(threads), 0);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) part[static_cast<size_t>(t)] = dot_chains(rounds);
  });
  int64_t lanes = 0;
  for (int64_t v : part) lanes += v;
  at::Tensor out = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  out.data_ptr<int64_t>()[0] = HAS_DOTS ? threads * rounds * CHAINS : 0;
  out.data_ptr<int64_t>()[1] = lanes;
  return out;
}

}  // namespace

// No tensor argument to dispatch on: one kernel for every key.
TORCH_LIBRARY_FRAGMENT(draftsman, m) { m.def("dot_products(int rounds) -> Tensor", &dot_products); }
