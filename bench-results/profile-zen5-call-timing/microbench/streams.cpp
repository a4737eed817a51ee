// Streams per thread: one sequential stream vs a pair's two interleaved streams (block b of
// group a, then of group b, groups `nb` records long), with NTA prefetches AHEAD records on.
#include <immintrin.h>
#include <omp.h>
#include <x86intrin.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <algorithm>
#include <cstdint>
constexpr int REC = 2304;
static inline __m512i touch(const uint8_t* p, __m512i acc, int reps) {
  __m512i a[8] = {acc, acc, acc, acc, acc, acc, acc, acc};
  for (int l = 0; l < REC; l += 64) {
    __m512i v = _mm512_load_si512(p + l);
    for (int i = 0; i < reps; i += 8) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) a[j] = _mm512_dpbusd_epi32(a[j], v, v);
    }
  }
  for (int j = 1; j < 8; ++j) a[0] = _mm512_add_epi32(a[0], a[j]);
  return a[0];
}
int main(int argc, char** argv) {
  const int mode = atoi(argv[1]), nb = atoi(argv[2]), reps = atoi(argv[3]), ahead = atoi(argv[4]);
  const size_t bytes = size_t(1) << 30;
  uint8_t* w = (uint8_t*)aligned_alloc(1 << 21, bytes);
  madvise(w, bytes, MADV_HUGEPAGE);
  memset(w, 1, bytes);
  const size_t group = size_t(REC) * nb, groups = bytes / group / 4 * 4;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    uint64_t t0 = __rdtsc();
    __m512i tot = _mm512_setzero_si512();
#pragma omp parallel num_threads(2)
    {
      __m512i acc = _mm512_setzero_si512();
      const int t = omp_get_thread_num();
      const size_t g0 = t * groups / 2, g1 = (t + 1) * groups / 2;
      if (mode == 0) {  // one stream
        const uint8_t* p = w + g0 * group;
        const uint8_t* end = w + g1 * group;
        for (; p < end; p += REC) {
          for (int l = 0; l < REC; l += 64) _mm_prefetch((const char*)std::min(p + ahead * REC + l, end - 64), _MM_HINT_NTA);
          acc = touch(p, acc, reps);
        }
      } else {  // pairs: block b of group g and g + 1
        for (size_t g = g0; g < g1; g += 2) {
          const uint8_t* a = w + g * group;
          const uint8_t* b = a + group;
          for (int k = 0; k < nb; ++k) {
            const int s = k + ahead / 2;  // pair_ahead: AHEAD / 2 steps on, into the next pair
            const uint8_t* pa = a + (s / nb) * 2 * group + (s % nb) * REC;
            for (int l = 0; l < REC; l += 64) {
              _mm_prefetch((const char*)std::min<const uint8_t*>(pa + l, w + bytes - 64), _MM_HINT_NTA);
              _mm_prefetch((const char*)std::min<const uint8_t*>(pa + group + l, w + bytes - 64), _MM_HINT_NTA);
            }
            acc = touch(a + k * REC, acc, reps);
            acc = touch(b + k * REC, acc, reps);
          }
        }
      }
#pragma omp critical
      tot = _mm512_add_epi32(tot, acc);
    }
    best = std::min(best, double(__rdtsc() - t0));
    if (_mm512_reduce_add_epi32(tot) == 12345) printf("x");
  }
  const double secs = best / 2.6e9;
  printf("mode %d nb %d reps %d ahead %d: %.1f GB/s, %.0f ref cycles a record\n", mode, nb, reps, ahead,
         groups * group / secs / 1e9, best * 2 / (groups * nb));
}
