// Can an AMX core overlap the three phases of the Q4_K tile path's block (gguf_matmul_records.cpp,
// q4k_group_tiles): the vector unpack of a record's nibbles times its split sub-block scales into
// 8 KB of B operands, the tile loads and products for one tile of 16 rows, and the per-row vector
// finish? Reference cycles per block (rdtsc), everything in L1 (8 records of 2368 bytes
// cycled), one thread; the phases are the kernel's instruction mix with runtime factors (loaded
// through an opaque register, so the compiler keeps vpmullw), not its exact code.
//
//   g++ -O2 -march=sapphirerapids -I ../../src/draftsman/kernels -o overlap overlap.cpp && taskset -c 1 ./overlap
#include <immintrin.h>
#include <x86intrin.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>

#include "amx_tiles.h"  // src/draftsman/kernels: the tile configuration record, Linux's permission

using draftsman_amx::TileConfig;

alignas(64) uint8_t rec[2368 * 64];
alignas(64) uint8_t bhi[3][4][1024], blo[3][4][1024];
alignas(64) int8_t act[16 * 320];
alignas(64) int32_t cbuf[3][2][256];
alignas(64) float acc[16 * 16];

alignas(64) int16_t factors[2][32];
static inline void unpack(const uint8_t* w, int buf) {
  const __m512i low4 = _mm512_set1_epi8(15);
  __m512i fh = _mm512_load_si512(factors[0]), fl = _mm512_load_si512(factors[1]);
  __asm__("" : "+v"(fh), "+v"(fl));
  for (int p = 0; p < 4; ++p) {
    for (int r = 0; r < 8; ++r) {
      const __m512i v = _mm512_loadu_si512(w + 320 + 512 * p + 64 * r);
      const __m512i q0 = _mm512_and_si512(v, low4);
      const __m512i q1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      _mm512_store_si512(bhi[buf][p] + 64 * r, _mm512_mullo_epi16(q0, fh));
      _mm512_store_si512(blo[buf][p] + 64 * r, _mm512_mullo_epi16(q0, fl));
      _mm512_store_si512(bhi[buf][p] + 64 * (8 + r), _mm512_mullo_epi16(q1, fh));
      _mm512_store_si512(blo[buf][p] + 64 * (8 + r), _mm512_mullo_epi16(q1, fl));
    }
  }
}

static __m512i sink;
static inline void unpack_no_stores(const uint8_t* w) {
  const __m512i low4 = _mm512_set1_epi8(15);
  __m512i fh = _mm512_load_si512(factors[0]), fl = _mm512_load_si512(factors[1]);
  __asm__("" : "+v"(fh), "+v"(fl));
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  for (int p = 0; p < 4; ++p) {
    for (int r = 0; r < 8; ++r) {
      const __m512i v = _mm512_loadu_si512(w + 320 + 512 * p + 64 * r);
      const __m512i q0 = _mm512_and_si512(v, low4);
      const __m512i q1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      s0 = _mm512_xor_si512(s0, _mm512_mullo_epi16(q0, fh));
      s1 = _mm512_xor_si512(s1, _mm512_mullo_epi16(q0, fl));
      s2 = _mm512_xor_si512(s2, _mm512_mullo_epi16(q1, fh));
      s3 = _mm512_xor_si512(s3, _mm512_mullo_epi16(q1, fl));
    }
  }
  sink = _mm512_xor_si512(sink, _mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3)));
  __asm__ volatile("" : : "v"(sink) : "memory");
}

static inline void stores_only(int buf) {
  const __m512i v = _mm512_set1_epi8(3);
  for (int p = 0; p < 4; ++p) {
    for (int r = 0; r < 16; ++r) {
      _mm512_store_si512(bhi[buf][p] + 64 * r, v);
      _mm512_store_si512(blo[buf][p] + 64 * r, v);
    }
  }
}

// 128 vpmullw on registers (8 chains of 16), no memory
template <int KIND>
static inline void alu128() {
  __m512i r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm512_set1_epi32(i + 1);
  __m512i t0 = _mm512_load_si512(factors[0]), t1 = _mm512_load_si512(factors[1]);
  __asm__("" : "+v"(t0), "+v"(t1));
  for (int s = 0; s < 16; ++s) {
    for (int i = 0; i < 8; ++i) {
      if constexpr (KIND == 0) r[i] = _mm512_mullo_epi16(r[i], t0);
    }
  }
  __m512i x = r[0];
  for (int i = 1; i < 8; ++i) x = _mm512_xor_si512(x, r[i]);
  sink = _mm512_xor_si512(sink, x);
  __asm__ volatile("" : : "v"(sink) : "memory");
}

static inline void dp_only() {  // 8 products, no tile loads or stores
  _tile_dpbsud(0, 2, 4);
  _tile_dpbsud(1, 2, 5);
  _tile_dpbsud(0, 3, 6);
  _tile_dpbsud(1, 3, 7);
  _tile_dpbsud(0, 2, 4);
  _tile_dpbsud(1, 2, 5);
  _tile_dpbsud(0, 3, 6);
  _tile_dpbsud(1, 3, 7);
}

static inline void loads_only() {  // the 12 tile loads of a block
  for (int c = 0; c < 4; c += 2) {
    _tile_loadd(2, act + 64 * c, 320);
    _tile_loadd(4, bhi[0][c], 64);
    _tile_loadd(5, blo[0][c], 64);
    _tile_loadd(3, act + 64 * (c + 1), 320);
    _tile_loadd(6, bhi[0][c + 1], 64);
    _tile_loadd(7, blo[0][c + 1], 64);
  }
}
static inline void stores_of_tiles() {
  _tile_stored(0, cbuf[0][0], 64);
  _tile_stored(1, cbuf[0][1], 64);
}

static inline void tiles(int buf) {
  _tile_zero(0);
  _tile_zero(1);
  for (int c = 0; c < 4; c += 2) {
    _tile_loadd(2, act + 64 * c, 320);
    _tile_loadd(4, bhi[buf][c], 64);
    _tile_loadd(5, blo[buf][c], 64);
    _tile_loadd(3, act + 64 * (c + 1), 320);
    _tile_loadd(6, bhi[buf][c + 1], 64);
    _tile_loadd(7, blo[buf][c + 1], 64);
    _tile_dpbsud(0, 2, 4);
    _tile_dpbsud(1, 2, 5);
    _tile_dpbsud(0, 3, 6);
    _tile_dpbsud(1, 3, 7);
  }
  _tile_stored(0, cbuf[buf][0], 64);
  _tile_stored(1, cbuf[buf][1], 64);
}

static inline void finish(int buf) {
  const __m512 d = _mm512_set1_ps(0.001f);
  for (int m = 0; m < 16; ++m) {
    const __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cbuf[buf][0] + 16 * m), 3),
                                          _mm512_load_si512(cbuf[buf][1] + 16 * m));
    __m512i msum = _mm512_setzero_si512();
    for (int t = 0; t < 4; ++t) msum = _mm512_dpwssd_epi32(msum, isum, _mm512_set1_epi32(t + m));
    const __m512 a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), _mm512_load_ps(acc + 16 * m));
    _mm512_store_ps(acc + 16 * m, _mm512_fnmadd_ps(d, _mm512_cvtepi32_ps(msum), a));
  }
}

template <typename F>
double cycles(const char* name, int n, F&& f) {
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const uint64_t t0 = __rdtsc();
    for (int i = 0; i < n; ++i) f(i);
    best = std::min(best, double(__rdtsc() - t0) / n);
  }
  std::printf("%-44s %7.1f ref cycles a block\n", name, best);
  return best;
}

int main() {
  if (!draftsman_amx::amx_permitted()) { std::puts("no AMX tiles here (or not granted)"); return 1; }
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  _tile_loadconfig(&cfg);
  for (size_t i = 0; i < sizeof(rec); ++i) rec[i] = uint8_t(i * 37);
  for (int i = 0; i < 32; ++i) { factors[0][i] = 0x0303; factors[1][i] = 0x0505; }
  for (size_t i = 0; i < sizeof(act); ++i) act[i] = int8_t(i * 11);
  const int n = 20000;
  auto w = [](int i) { return rec + 2368 * (i % 8); };  // 8 records: L1/L2 resident
  cycles("unpack only", n, [&](int i) { unpack(w(i), 0); });
  cycles("tiles only", n, [&](int) { tiles(0); });
  cycles("finish only", n, [&](int) { finish(0); });
  cycles("serial: unpack, tiles, finish", n, [&](int i) { unpack(w(i), 0); tiles(0); finish(0); });
  cycles("two buffers: tiles(b), unpack(b+1), finish(b)", n, [&](int i) {
    tiles(i & 1); unpack(w(i + 1), (i + 1) & 1); finish(i & 1); });
  cycles("two buffers: tiles(b), unpack(b+1), finish(b-1)", n, [&](int i) {
    tiles(i & 1); unpack(w(i + 1), (i + 1) & 1); finish((i + 1) & 1); });
  cycles("three buffers: tiles(b), unpack(b+2), finish(b-1)", n, [&](int i) {
    tiles(i % 3); unpack(w(i + 2), (i + 2) % 3); finish((i + 2) % 3); });
  cycles("unpack + finish (no tiles)", n, [&](int i) { unpack(w(i), 0); finish(0); });
  cycles("tiles + finish (no unpack)", n, [&](int) { tiles(0); finish(0); });
  cycles("unpack + tiles (no finish)", n, [&](int i) { unpack(w(i), 0); tiles(0); });
  cycles("unpack without stores", n, [&](int i) { unpack_no_stores(w(i)); });
  cycles("stores only (8 KB)", n, [&](int i) { stores_only(i & 1); });
  cycles("tiles(0) + unpack without stores", n, [&](int i) { tiles(0); unpack_no_stores(w(i)); });
  cycles("tiles(0) + stores only into buffer 1", n, [&](int) { tiles(0); stores_only(1); });
  cycles("tiles(0) + unpack into buffer 1", n, [&](int i) { tiles(0); unpack(w(i), 1); });
  cycles("tiles(0) + finish(1)", n, [&](int) { tiles(0); finish(1); });
  cycles("128 vpmullw", n, [&](int) { alu128<0>(); });
  cycles("tiles + 128 vpmullw", n, [&](int) { tiles(0); alu128<0>(); });
  tiles(0);
  cycles("8 products alone (no tile loads/stores)", n, [&](int) { dp_only(); });
  cycles("8 products + 128 vpmullw", n, [&](int) { dp_only(); alu128<0>(); });
  cycles("8 products + unpack (stores)", n, [&](int i) { dp_only(); unpack(w(i), 1); });
  cycles("12 tile loads alone", n, [&](int) { loads_only(); });
  cycles("12 tile loads + unpack (stores)", n, [&](int i) { loads_only(); unpack(w(i), 1); });
  cycles("2 tile stores alone", n, [&](int) { stores_of_tiles(); });
  cycles("2 tile stores + unpack (stores)", n, [&](int i) { stores_of_tiles(); unpack(w(i), 1); });
  _tile_release();
  std::printf("%g\n", acc[3]);
  return 0;
}
