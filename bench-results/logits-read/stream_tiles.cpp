// A synthetic of the int8-row tile path at 16 rows from memory on 2 threads: records of 4,160
// bytes streamed with the kernels' prefetch 8 ahead, tile work as byte_one_tile does it, and
// the head's outputs stored four ways. Build and run (HUGE=1: the records on 2 MiB pages):
//   g++ -O2 -march=sapphirerapids -fopenmp -o stream_tiles stream_tiles.cpp && HUGE=1 ./stream_tiles 2
// How a record stream from memory overlaps with per-record work on an AMX core.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

constexpr int REC = 4160, AHEAD = 8;
struct Pf {
  const char* n; const char* l;
  Pf(const uint8_t* r) : n((const char*)r + AHEAD * REC), l(n + REC - 1) {}
  inline void line() { _mm_prefetch(std::min(n, l), _MM_HINT_T1); n += 64; }
  inline void rest() { for (; n <= l; n += 64) _mm_prefetch(n, _MM_HINT_T1); }
};
struct Cfg { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; };
void config() {
  Cfg c{}; c.palette = 1;
  for (int t = 0; t < 8; ++t) { c.colsb[t] = 64; c.rows[t] = 16; }
  _tile_loadconfig(&c);
}
alignas(64) thread_local uint8_t abuf[16 * 320 * 4];
alignas(64) thread_local uint8_t bbuf[4096];
alignas(64) thread_local int32_t cbuf[256];

template <int MODE>
float run(const uint8_t* w, int64_t n, uint8_t* y) {
  __m512i acc = _mm512_setzero_si512();
  __m512 sums[16];
  for (int m = 0; m < 16; ++m) sums[m] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i, w += REC) {
    Pf pf(w);
    if constexpr (MODE == 0 || MODE == 3) {  // demand loads of the record, prefetch spread
      for (int l = 0; l < 64; ++l) { pf.line(); acc = _mm512_xor_si512(acc, _mm512_load_si512(w + 64 * l)); }
    }
    if constexpr (MODE == 1) {  // demand loads + ALU work (16 rows x 6 fp ops)
      for (int l = 0; l < 64; ++l) { pf.line(); acc = _mm512_xor_si512(acc, _mm512_load_si512(w + 64 * l)); }
      const __m512 f = _mm512_castsi512_ps(acc);
      for (int m = 0; m < 16; ++m) sums[m] = _mm512_fmadd_ps(_mm512_fmadd_ps(f, f, sums[m]), f, _mm512_mul_ps(sums[m], f));
      for (int m = 0; m < 16; ++m) sums[m] = _mm512_fmadd_ps(_mm512_fmadd_ps(f, f, sums[m]), f, _mm512_mul_ps(sums[m], f));
    }
    if constexpr (MODE == 2 || MODE == 3 || MODE == 4 || MODE == 5 || MODE >= 6) {  // tile work
      _tile_zero(0);
      for (int p = 0; p < 4; ++p) {
        _tile_loadd(2, abuf + 64 * p, 320);
        if constexpr (MODE == 2 || MODE >= 6) _tile_stream_loadd(4, w + 64 + 1024 * p, 64);
        else _tile_loadd(4, bbuf + 1024 * (p & 3) / 4, 64);
        _tile_dpbsud(0, 2, 4);
      }
      _tile_stored(0, cbuf, 64);
      for (int m = 0; m < 16; ++m) {
        if constexpr (MODE != 5) { pf.line(); pf.line(); pf.line(); pf.line(); }
        sums[m] = _mm512_fmadd_ps(_mm512_set1_ps(1.5f), _mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 16 * m)), sums[m]);
      }
      if constexpr (MODE == 5) { for (int l = 0; l < 64; ++l) pf.line(); }
    }
    if constexpr (MODE == 6) {
      if (i % 4 == 3) { const int64_t g = i / 4;
        for (int m = 0; m < 16; ++m) _mm256_storeu_si256((__m256i*)(y + m * 303872 + 32 * g), _mm512_cvtepi32_epi16(_mm512_castps_si512(sums[m]))); }
    }
    if constexpr (MODE == 10) {
      const int64_t g = i / 4;
      for (int m = 4 * (i % 4); m < 4 * (i % 4) + 4; ++m) _m_prefetchw(y + m * 303872 + 32 * (g + 4));
      if (i % 4 == 3) {
        for (int m = 0; m < 16; ++m) _mm256_storeu_si256((__m256i*)(y + m * 303872 + 32 * g), _mm512_cvtepi32_epi16(_mm512_castps_si512(sums[m]))); }
    }
    if constexpr (MODE == 9) {
      if (i % 4 == 3) { const int64_t g = i / 4;
        for (int m = 0; m < 16; ++m) _mm256_stream_si256((__m256i*)(y + m * 303872 + 32 * g), _mm512_cvtepi32_epi16(_mm512_castps_si512(sums[m]))); }
    }
    if constexpr (MODE == 7 || MODE == 8) {
      if (i % 8 == 7) { const int64_t g = i / 8;
        for (int m = 0; m < 16; ++m) {
          __m512i v = _mm512_castps_si512(sums[m]);
          if constexpr (MODE == 7) _mm512_stream_si512((__m512i*)(y + m * 303872 + 64 * g), v);
          else _mm512_store_si512((__m512i*)(y + m * 303872 + 64 * g), v);
        } }
    }
    pf.rest();
  }
  float s = 0; alignas(64) float t[16];
  for (int m = 0; m < 16; ++m) { _mm512_store_ps(t, sums[m]); s += t[0]; }
  alignas(64) int32_t u[16]; _mm512_store_si512(u, acc); return s + u[0];
}

int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);  // ARCH_REQ_XCOMP_PERM XFEATURE_XTILEDATA
  const int64_t nrec = 120000;
  const size_t len = ((nrec + 64) * REC + (2 << 20)) / (2 << 20) * (2 << 20);
  uint8_t* buf = (uint8_t*)std::aligned_alloc(2 << 20, len);
  if (getenv("HUGE")) madvise(buf, len, MADV_HUGEPAGE);
  std::memset(buf, 1, nrec * REC + 64 * REC);
  uint8_t* out = (uint8_t*)std::aligned_alloc(4096, 16 * 303872 + 4096);
  std::memset(out, 0, 16 * 303872 + 4096);
  const char* names[] = {"loads", "loads+alu", "tiles(B from record)", "loads+tiles(B in L1)", "tiles only(B L1, pf spread)", "tiles only(pf after)", "tiles+32B stores/group", "tiles+NT 64B stores/2 groups", "tiles+64B stores/2 groups", "tiles+NT 32B stores/group", "tiles+32B stores, prefetchw"};
  const int threads = argc > 1 ? atoi(argv[1]) : 2;
  for (int round = 0; round < 3; ++round) {
    for (int mode : {0, 2, 6, 7, 10}) {
      double best = 1e9; float sink = 0;
      for (int rep = 0; rep < 5; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
          config();
          const int t = omp_get_thread_num(), nt = omp_get_num_threads();
          const int64_t share = nrec / nt;
          const uint8_t* w = buf + t * share * REC;
          uint8_t* y = out + t * (share / 4) * 32;
          switch (mode) {
            case 0: sink += run<0>(w, share, y); break;
            case 1: sink += run<1>(w, share, y); break;
            case 2: sink += run<2>(w, share, y); break;
            case 3: sink += run<3>(w, share, y); break;
            case 4: sink += run<4>(w, share, y); break;
            case 5: sink += run<5>(w, share, y); break;
            case 6: sink += run<6>(w, share, y); break;
            case 7: sink += run<7>(w, share, y); break;
            case 8: sink += run<8>(w, share, y); break;
            case 9: sink += run<9>(w, share, y); break;
            case 10: sink += run<10>(w, share, y); break;
          }
          _tile_release();
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, s);
      }
      printf("%-30s %7.2f ms  %5.1f GB/s  %6.1f ns/record/thread %s\n", names[mode], best * 1e3,
             nrec * REC / best / 1e9, best * 1e9 / (nrec / threads), sink == 12345 ? "!" : "");
    }
    // compute alone: tiles from L1, on a small working set (the same 64 records again and again)
  }
}
