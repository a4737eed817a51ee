// Reference cycles (rdtsc) per record and per record-row of the records kernel's group loop
// (gguf_matmul_records.cpp), called directly: no PyTorch dispatch, no activation quantisation,
// no output conversion, so what is left is the kernel's own work on one unit of groups of 16
// weight rows after another. Built and run by scripts/records_cycles.py.
//
//   records_cycles QTYPE BLOCKS GROUPS PASSES THREADS REPEATS UNIT ROWS...
//   records_cycles peak     the floor: independent vpdpbusd (zmm) a reference cycle, one thread
//
// QTYPE 12 (Q4_K), 14 (Q6_K) or 1000 (int8 rows, --dtype q8), on the vector paths (tiles off, as a CPU without AMX runs
// them); BLOCKS records a group (6: K = 1536); GROUPS groups, laid out one after another as a
// packed matrix is (few: from L2; more than the last-level cache holds: from memory, on 2 MiB
// pages where Linux allows, as the loader places records); the groups are split evenly over
// THREADS OpenMP threads, each thread passing its own groups PASSES times a sweep (many
// passes over few groups keep a thread's weights in its L2 and make a sweep long enough
// that starting the threads does not count). UNIT 2: the groups two at a call, as the
// kernel hands them out (paired where it pairs them, kquant_records_pairs.h); 1: one at a
// time, the one-group paths. Prints, per row count, the best of REPEATS sweeps.
//
// The kernel source is included, not linked: its group loops live in an anonymous namespace.
#include "gguf_matmul_records.cpp"

#include <sys/mman.h>
#include <x86intrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

// vpdpbusd a reference cycle when nothing else runs: 16 independent accumulators, so neither
// latency nor loads limit it (the kernel's 64 a record-row can go no faster than this)
double peak_dpbusd() {
  constexpr long ITERATIONS = 50'000'000;
  long n = ITERATIONS;
  const uint64_t start = __rdtsc();
  __asm__ volatile(
      "vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm17, %%zmm17, %%zmm17\n\t"
      "1:\n\t"
      "vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\t"
      "vpdpbusd %%zmm16, %%zmm17, %%zmm2\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm3\n\t"
      "vpdpbusd %%zmm16, %%zmm17, %%zmm4\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm5\n\t"
      "vpdpbusd %%zmm16, %%zmm17, %%zmm6\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm7\n\t"
      "vpdpbusd %%zmm16, %%zmm17, %%zmm8\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm9\n\t"
      "vpdpbusd %%zmm16, %%zmm17, %%zmm10\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm11\n\t"
      "vpdpbusd %%zmm16, %%zmm17, %%zmm12\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm13\n\t"
      "vpdpbusd %%zmm16, %%zmm17, %%zmm14\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm15\n\t"
      "dec %0\n\tjnz 1b"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc");
  return 16.0 * ITERATIONS / static_cast<double>(__rdtsc() - start);
}

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "peak") {
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) best = std::max(best, peak_dpbusd());
    std::printf("peak %.3f\n", best);
    return 0;
  }
  if (argc < 9) {
    std::fprintf(stderr, "usage: records_cycles QTYPE BLOCKS GROUPS PASSES THREADS REPEATS UNIT ROWS...\n");
    return 2;
  }
  const int qtype = std::atoi(argv[1]), nb = std::atoi(argv[2]), groups = std::atoi(argv[3]);
  const int passes = std::atoi(argv[4]), threads = std::atoi(argv[5]), repeats = std::atoi(argv[6]);
  const int unit = std::atoi(argv[7]);
  if (unit != 1 && unit != 2) {
    std::fprintf(stderr, "UNIT must be 1 or 2\n");
    return 2;
  }
  if (qtype != TYPE_Q4_K && qtype != TYPE_Q6_K && qtype != TYPE_I8_ROW) {
    std::fprintf(stderr, "QTYPE must be 12 (Q4_K), 14 (Q6_K) or 1000 (int8 rows)\n");
    return 2;
  }
  const size_t rec = static_cast<size_t>(record_bytes(qtype)), group_bytes = rec * nb;
  constexpr size_t PAGE = size_t{2} << 20;
  const size_t bytes = (group_bytes * groups + PAGE - 1) / PAGE * PAGE;
  auto* w = static_cast<uint8_t*>(std::aligned_alloc(PAGE, bytes));
  madvise(w, bytes, MADV_HUGEPAGE);
  std::mt19937 rng(1);
  for (size_t i = 0; i < bytes; ++i) w[i] = static_cast<uint8_t>(rng());
  // each record's float16 scales in [2^-4, 2^-3) (int8 rows: float32 column scales 2^-4):
  // finite sums whatever the random bytes
  const int halves = qtype == TYPE_Q4_K ? 32 : 16;
  for (size_t r = 0; r < static_cast<size_t>(groups) * nb; ++r) {
    if (qtype == TYPE_I8_ROW) {
      auto* d = reinterpret_cast<float*>(w + r * rec + I8_OFF_D);
      for (int i = 0; i < COLS; ++i) d[i] = 0.0625f;
      continue;
    }
    auto* d = reinterpret_cast<uint16_t*>(w + r * rec);
    for (int i = 0; i < halves; ++i) d[i] = static_cast<uint16_t>(0x2C00 + (rng() & 0x3FF));
  }
  std::vector<Q8Block> x(static_cast<size_t>(16) * nb);  // row-major (row m's block b at m nb + b) or block-major
  for (auto& b : x) {
    for (int i = 0; i < QK; ++i) b.q[i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    b.d = 0.01f;
    int32_t sum16[QK / 16] = {};
    for (int i = 0; i < QK; ++i) sum16[i / 16] += b.q[i];
    for (int j = 0; j < QK / 16; ++j) {
      b.bsums[j] = static_cast<int16_t>(sum16[j]);
      b.q6_offsets[j] = -32 * sum16[j];
    }
    for (int j = 0; j < QK / 32; ++j) b.psums[j] = static_cast<int16_t>(sum16[2 * j] + sum16[2 * j + 1]);
  }
  const double tsc0 = static_cast<double>(__rdtsc());
  const auto t0 = std::chrono::steady_clock::now();
  for (int a = 8; a < argc; ++a) {
    const int rows = std::atoi(argv[a]);
    if (rows < 1 || rows > 16) {
      std::fprintf(stderr, "ROWS must be 1..16\n");
      return 2;
    }
    const bool by_block = rows_by_block(qtype, rows);  // as the kernel lays the rows out
    double best = 1e300;
    for (int rep = 0; rep < repeats; ++rep) {
      const uint64_t start = __rdtsc();
#pragma omp parallel num_threads(threads)
      for (int pass = 0; pass < passes; ++pass) {
#pragma omp for schedule(static) nowait
        for (int g = 0; g < groups; g += unit) {
          alignas(64) float acc[2 * 16 * COLS] = {};
          groups_product(qtype, Unit::consecutive(w + group_bytes * g, static_cast<int64_t>(group_bytes),
                                                  std::min(unit, groups - g)),
                         x.data(), nb, false, by_block ? 1 : nb, by_block ? rows : 1, rows, 0, false, acc,
                         16 * COLS);
        }
      }
      best = std::min(best, static_cast<double>(__rdtsc() - start));
    }
    // per thread: the sweep's cycles times the threads over the records
    const double per_record = best * threads / (static_cast<double>(groups) * nb * passes);
    std::printf("%d %.1f %.2f\n", rows, per_record, per_record / rows);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("tsc_ghz %.3f\n", (static_cast<double>(__rdtsc()) - tsc0) / secs / 1e9);
  std::free(w);
  return 0;
}
