// The tile-friendly 4-bit record of README.md, built as a harness: how fast would a matrix in
// it go at 1 row (AVX-512 VNNI vectors) and at 16 rows (AMX-INT8 tiles), from memory, on
// 2 threads? Not draftsman's kernel: the products, finish and prefetch of the proposed format
// only, timed against the real Q4_K kernel by scripts/records_kernel_time.py in the same
// session.
//
// A record: 16 columns x 256 k. B operand line l (0..63) is k 4l..4l+3 of the 16 columns in
// VNNI order (64 bytes); packed line j (0..31) holds line j in its low nibbles and line 32 + j
// in its high ones, so group 0 (k 0..127) is lines 0..31 and group 1 (k 128..255) lines 32..63.
// Then a float scale and a float minimum per group and column: w = s q + m, q in 0..15.
// Row x (int8, one float scale d per 256 k, its sum per group xs): sum_k x w =
//   d (s sum_k xq q + m xs)   per group and column, sum_k xq q an exact int32 tile sum.
//
//   g++ -O2 -march=sapphirerapids -fopenmp -I ../../src/draftsman/kernels \
//       -o int4_records int4_records.cpp && ./int4_records
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "amx_tiles.h"  // the tile configuration record, Linux's permission

constexpr int N = 8960, K = 1536, GROUPS = N / 16, NB = K / 256, MATRICES = 24;
constexpr int RECORD = 2048 + 256;  // nibbles, then s[2][16], m[2][16]
constexpr int AHEAD = 8;            // records prefetched ahead, as the kernel's RecordPrefetch

struct Rows {  // activations: int8 rows, a scale per 256 k, sums per 128
  std::vector<int8_t> q;             // [rows][K]
  std::vector<float> d;              // [rows][NB]
  std::vector<float> xs;             // [rows][NB][2]: d * sum over the group
};

uint8_t* huge(size_t bytes) {
  const size_t page = size_t{1} << 21, length = (bytes + page - 1) / page * page;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(page, length));
  madvise(p, length, MADV_HUGEPAGE);
  return p;
}

inline void prefetch_line(const uint8_t* w, int line) {
  _mm_prefetch(reinterpret_cast<const char*>(w + AHEAD * RECORD + 64 * line), _MM_HINT_T0);
}

// one row: each packed line meets the row's 4 bytes of its two k ranges in vpdpbusd
void group_one_row(const uint8_t* w, const Rows& x, float* out) {
  const __m512i low4 = _mm512_set1_epi8(15);
  __m512 sums = _mm512_setzero_ps();
  for (int b = 0; b < NB; ++b, w += RECORD) {
    const int8_t* xq = x.q.data() + 256 * b;
    __m512i c0 = _mm512_setzero_si512(), c1 = c0;
    for (int j = 0; j < 32; ++j) {
      const __m512i v = _mm512_load_si512(w + 64 * j);
      const __m512i lo = _mm512_and_si512(v, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      c0 = _mm512_dpbusd_epi32(c0, lo, _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xq + 4 * j)));
      c1 = _mm512_dpbusd_epi32(c1, hi, _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xq + 128 + 4 * j)));
      if (j < 18) prefetch_line(w, 2 * j), prefetch_line(w, 2 * j + 1);
    }
    const float* f = reinterpret_cast<const float*>(w + 2048);
    const __m512 d = _mm512_set1_ps(x.d[b]);
    __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), _mm512_load_ps(f), _mm512_mul_ps(_mm512_load_ps(f + 32), _mm512_set1_ps(x.xs[2 * b] / x.d[b])));
    t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), _mm512_load_ps(f + 16), _mm512_fmadd_ps(_mm512_load_ps(f + 48), _mm512_set1_ps(x.xs[2 * b + 1] / x.d[b]), t));
    sums = _mm512_fmadd_ps(d, t, sums);
  }
  _mm512_storeu_ps(out, sums);
}

// 16 rows: the nibbles unpacked once into 4 KB of B operands, two groups of two tile products
void group_tiles(const uint8_t* w, const Rows& x, float* out) {
  alignas(64) uint8_t bops[64 * 64];
  alignas(64) int32_t cbuf[2][256];
  const __m512i low4 = _mm512_set1_epi8(15);
  __m512 sums[16];
  for (int m = 0; m < 16; ++m) sums[m] = _mm512_setzero_ps();
  for (int b = 0; b < NB; ++b, w += RECORD) {
    for (int j = 0; j < 32; ++j) {
      const __m512i v = _mm512_load_si512(w + 64 * j);
      _mm512_store_si512(bops + 64 * j, _mm512_and_si512(v, low4));
      _mm512_store_si512(bops + 64 * (32 + j), _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
      if (j < 18) prefetch_line(w, 2 * j), prefetch_line(w, 2 * j + 1);
    }
    const int8_t* xq = x.q.data() + 256 * b;
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, xq, K);
    _tile_loadd(4, bops, 64);
    _tile_loadd(3, xq + 64, K);
    _tile_loadd(5, bops + 1024, 64);
    _tile_dpbsud(0, 2, 4);
    _tile_dpbsud(0, 3, 5);
    _tile_loadd(2, xq + 128, K);
    _tile_loadd(6, bops + 2048, 64);
    _tile_loadd(3, xq + 192, K);
    _tile_loadd(7, bops + 3072, 64);
    _tile_dpbsud(1, 2, 6);
    _tile_dpbsud(1, 3, 7);
    _tile_stored(0, cbuf[0], 64);
    _tile_stored(1, cbuf[1], 64);
    const float* f = reinterpret_cast<const float*>(w + 2048);
    const __m512 s0 = _mm512_load_ps(f), s1 = _mm512_load_ps(f + 16);
    const __m512 m0 = _mm512_load_ps(f + 32), m1 = _mm512_load_ps(f + 48);
    for (int m = 0; m < 16; ++m) {
      const float d = x.d[NB * m + b];
      __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf[0] + 16 * m)), _mm512_mul_ps(s0, _mm512_set1_ps(d)),
                                 _mm512_mul_ps(m0, _mm512_set1_ps(x.xs[2 * (NB * m + b)])));
      t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf[1] + 16 * m)), _mm512_mul_ps(s1, _mm512_set1_ps(d)),
                          _mm512_fmadd_ps(m1, _mm512_set1_ps(x.xs[2 * (NB * m + b) + 1]), t));
      sums[m] = _mm512_add_ps(sums[m], t);
    }
  }
  for (int m = 0; m < 16; ++m) _mm512_storeu_ps(out + N * m, sums[m]);
}

int main() {
  if (!draftsman_amx::amx_permitted()) return std::puts("no AMX permission"), 1;
  std::mt19937 rng(7);
  const size_t bytes = size_t{GROUPS} * NB * RECORD;
  std::vector<uint8_t*> mats(MATRICES);
  for (auto& m : mats) {
    m = huge(bytes);
    for (size_t i = 0; i < bytes; ++i) m[i] = static_cast<uint8_t>(rng());
    for (size_t r = 0; r < size_t{GROUPS} * NB; ++r) {  // sane scales and minimums
      float* f = reinterpret_cast<float*>(m + r * RECORD + 2048);
      for (int i = 0; i < 64; ++i) f[i] = i < 32 ? 0.01f : -0.08f;
    }
  }
  Rows x;
  x.q.resize(16 * K);
  x.d.assign(16 * NB, 0.02f);
  x.xs.assign(16 * NB * 2, 0.0f);
  for (int m = 0; m < 16; ++m)
    for (int b = 0; b < NB; ++b)
      for (int g = 0; g < 2; ++g) {
        int s = 0;
        for (int k = 0; k < 128; ++k) s += x.q[K * m + 256 * b + 128 * g + k] = static_cast<int8_t>(rng() % 255 - 127);
        x.xs[2 * (NB * m + b) + g] = 0.02f * s;
      }
  // the tiles' operands: 16 activation rows of the matrix's K (strided), tile 16 x 64 bytes
  draftsman_amx::TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  std::vector<float> out1(N), out16(16 * N);

  // exactness of the two paths against each other on matrix 0 (row 0: the same sums, the
  // same float steps up to the order of two fused operations)
  auto one_row_of = [&](const Rows& all, int m) {
    Rows r;
    r.q.assign(all.q.begin() + K * m, all.q.begin() + K * (m + 1));
    r.d.assign(all.d.begin() + NB * m, all.d.begin() + NB * (m + 1));
    r.xs.assign(all.xs.begin() + 2 * NB * m, all.xs.begin() + 2 * NB * (m + 1));
    return r;
  };
  const Rows row5 = one_row_of(x, 5);
  double worst = 0;
  for (int g = 0; g < GROUPS; ++g) {
    group_one_row(mats[0] + static_cast<size_t>(g) * NB * RECORD, row5, out1.data() + 16 * g);
    group_tiles(mats[0] + static_cast<size_t>(g) * NB * RECORD, x, out16.data() + 16 * g);
  }
  for (int n = 0; n < N; ++n) worst = std::max(worst, std::fabs(double(out1[n]) - out16[N * 5 + n]) / (1e-3 + std::fabs(out1[n])));
  std::printf("row 5 on vectors against tiles: worst relative difference %.2e\n", worst);

  const Rows row0 = one_row_of(x, 0);
  for (int round = 0; round < 7; ++round) {
    for (int rows : {1, 16}) {
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2)
      {
        if (rows == 16) _tile_loadconfig(&cfg);
        const int th = omp_get_thread_num(), lo = th * GROUPS / 2, hi = (th + 1) * GROUPS / 2;
        for (int mi = 0; mi < MATRICES; ++mi)
          for (int g = lo; g < hi; ++g) {
            const uint8_t* w = mats[mi] + static_cast<size_t>(g) * NB * RECORD;
            if (rows == 1) group_one_row(w, row0, out1.data() + 16 * g);
            else group_tiles(w, x, out16.data() + 16 * g);
          }
      }
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("round %d: %2d rows %.3f ms a matrix (%.1f GB/s)\n", round, rows, ms / MATRICES,
                  bytes / (ms / MATRICES) / 1e6);
    }
  }
  return 0;
}
