// Which vector operations share vpdpbusd's pipes on this core: a loop of 12 independent
// vpdpbusd (zmm) alone, then with 2 or 4 more independent operations of one kind beside
// them. If an operation runs on other pipes the loop's time stays; if it shares, it grows.
//   g++ -O2 -march=native ports.cpp -o ports && ./ports
#include <x86intrin.h>
#include <cstdint>
#include <cstdio>

constexpr int ITERS = 1'000'000;
alignas(64) static int32_t mem[64];

#define DP12                                                                              \
  "vpdpbusd %%zmm12, %%zmm13, %%zmm0\n vpdpbusd %%zmm12, %%zmm13, %%zmm1\n"               \
  "vpdpbusd %%zmm12, %%zmm13, %%zmm2\n vpdpbusd %%zmm12, %%zmm13, %%zmm3\n"               \
  "vpdpbusd %%zmm12, %%zmm13, %%zmm4\n vpdpbusd %%zmm12, %%zmm13, %%zmm5\n"               \
  "vpdpbusd %%zmm12, %%zmm13, %%zmm6\n vpdpbusd %%zmm12, %%zmm13, %%zmm7\n"               \
  "vpdpbusd %%zmm12, %%zmm13, %%zmm8\n vpdpbusd %%zmm12, %%zmm13, %%zmm9\n"               \
  "vpdpbusd %%zmm12, %%zmm13, %%zmm10\n vpdpbusd %%zmm12, %%zmm13, %%zmm11\n"

#define LOOP(extra)                                                                       \
  [&] {                                                                                   \
    uint64_t best = ~0ull;                                                                \
    for (int rep = 0; rep < 7; ++rep) {                                                   \
      const uint64_t t0 = __rdtsc();                                                      \
      for (int it = 0; it < ITERS; ++it) {                                                \
        __asm__ volatile(DP12 extra : : "r"(mem) : "memory", "zmm0", "zmm1", "zmm2", "zmm3", \
                         "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", "zmm11",   \
                         "zmm14", "zmm15", "zmm16", "zmm17", "zmm18", "zmm19");             \
      }                                                                                   \
      const uint64_t t = __rdtsc() - t0;                                                  \
      if (t < best) best = t;                                                             \
    }                                                                                     \
    return double(best) / ITERS;                                                          \
  }()

int main() {
  __asm__ volatile("vpxord %%zmm12, %%zmm12, %%zmm12\n vpxord %%zmm13, %%zmm13, %%zmm13" ::: "zmm12", "zmm13");
  std::printf("reference cycles an iteration (TSC)\n");
  std::printf("12 vpdpbusd alone                  %6.2f\n", LOOP(""));
  std::printf("+2 vfmadd231ps                     %6.2f\n", LOOP("vfmadd231ps %%zmm12, %%zmm13, %%zmm14\n vfmadd231ps %%zmm12, %%zmm13, %%zmm15\n"));
  std::printf("+4 vfmadd231ps                     %6.2f\n", LOOP("vfmadd231ps %%zmm12, %%zmm13, %%zmm14\n vfmadd231ps %%zmm12, %%zmm13, %%zmm15\n vfmadd231ps %%zmm12, %%zmm13, %%zmm16\n vfmadd231ps %%zmm12, %%zmm13, %%zmm17\n"));
  std::printf("+4 vmulps                          %6.2f\n", LOOP("vmulps %%zmm12, %%zmm13, %%zmm14\n vmulps %%zmm12, %%zmm13, %%zmm15\n vmulps %%zmm12, %%zmm13, %%zmm16\n vmulps %%zmm12, %%zmm13, %%zmm17\n"));
  std::printf("+4 vcvtdq2ps                       %6.2f\n", LOOP("vcvtdq2ps %%zmm12, %%zmm14\n vcvtdq2ps %%zmm12, %%zmm15\n vcvtdq2ps %%zmm13, %%zmm16\n vcvtdq2ps %%zmm13, %%zmm17\n"));
  std::printf("+4 vpandd zmm, m512                %6.2f\n", LOOP("vpandd (%0), %%zmm12, %%zmm14\n vpandd 64(%0), %%zmm12, %%zmm15\n vpandd 128(%0), %%zmm13, %%zmm16\n vpandd 192(%0), %%zmm13, %%zmm17\n"));
  std::printf("+4 vpandd zmm, zmm                 %6.2f\n", LOOP("vpandd %%zmm13, %%zmm12, %%zmm14\n vpandd %%zmm13, %%zmm12, %%zmm15\n vpandd %%zmm12, %%zmm13, %%zmm16\n vpandd %%zmm12, %%zmm13, %%zmm17\n"));
  std::printf("+4 vpsrlw zmm                      %6.2f\n", LOOP("vpsrlw $4, %%zmm12, %%zmm14\n vpsrlw $4, %%zmm12, %%zmm15\n vpsrlw $4, %%zmm13, %%zmm16\n vpsrlw $4, %%zmm13, %%zmm17\n"));
  std::printf("+6 vpbroadcastd zmm, m32           %6.2f\n", LOOP("vpbroadcastd (%0), %%zmm14\n vpbroadcastd 4(%0), %%zmm15\n vpbroadcastd 8(%0), %%zmm16\n vpbroadcastd 12(%0), %%zmm17\n vpbroadcastd 16(%0), %%zmm18\n vpbroadcastd 20(%0), %%zmm19\n"));
  std::printf("+4 vpdpwssd                        %6.2f\n", LOOP("vpdpwssd %%zmm12, %%zmm13, %%zmm14\n vpdpwssd %%zmm12, %%zmm13, %%zmm15\n vpdpwssd %%zmm12, %%zmm13, %%zmm16\n vpdpwssd %%zmm12, %%zmm13, %%zmm17\n"));
  std::printf("+4 vpaddd                          %6.2f\n", LOOP("vpaddd %%zmm12, %%zmm13, %%zmm14\n vpaddd %%zmm12, %%zmm13, %%zmm15\n vpaddd %%zmm12, %%zmm13, %%zmm16\n vpaddd %%zmm12, %%zmm13, %%zmm17\n"));
  std::printf("+4 vpmulld                         %6.2f\n", LOOP("vpmulld %%zmm12, %%zmm13, %%zmm14\n vpmulld %%zmm12, %%zmm13, %%zmm15\n vpmulld %%zmm12, %%zmm13, %%zmm16\n vpmulld %%zmm12, %%zmm13, %%zmm17\n"));
}
