// The small pieces of the AMX K-quant kernel (gguf_matmul_records.cpp): the weight prefetcher,
// the tile configuration, a Q4_K and a Q6_K record's widened scales, the per-row finish of a
// block and the vpdpbusd step of the few-row path. Shared by its Q4_K and Q6_K paths and the
// paired groups (kquant_records_pairs.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kquant_records.h"
#include "amx_tiles.h"
#include "kquant_blocks.h"

// The records' vector path needs AVX-512 with VNNI (Ice Lake and later Xeons, Zen 4 and
// later EPYCs); their tile path AMX-INT8 besides (Sapphire Rapids and later Xeons).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define DRAFTSMAN_RECORDS 1
#else
#define DRAFTSMAN_RECORDS 0
#endif
#if DRAFTSMAN_RECORDS && defined(__AMX_INT8__) && defined(__AMX_TILE__)
#define DRAFTSMAN_AMX 1
#else
#define DRAFTSMAN_AMX 0
#endif

#if DRAFTSMAN_RECORDS
namespace draftsman_amx {

using draftsman_kquant::Q8Block;

// The record AHEAD on is fetched a line at a time, spread over the current record's work.
// Where it goes is declared per CPU kind (native.py: prefetch_flags). Zen 5 and later AMD
// cores (DRAFTSMAN_PREFETCH_NTA): non-temporal into L1, 4 ahead. Others: into L2, 8 records
// ahead (tuned on an AMX Xeon). The weights pass once a forward, far more than the caches
// hold, so they need not stay in L2 or L3, and on a Zen 5 EPYC this streamed faster at every
// row count (the 1.5B q4, 2 threads: one row 17.0-17.4 -> 14.3-14.5 ms, 8 rows 26.0-26.3 ->
// 24.8-25.2; the 0.5B's one row 8.5 -> 7.6, 16 rows 18.2 -> 15.4;
// bench-results/profile-zen5-nta-prefetch); prefetches into L1 (T0) were between the two,
// and distances of 2, 4, 6 and 8 records level within noise.
// A core keeps only ~16 misses in flight (its fill buffers): a burst of a whole record's
// lines at its start stalled the core until the buffers drained, so the weight stream and
// the tile work took turns instead of overlapping (an AMX Xeon, 8960 x 1536 Q4_K from
// memory, 2 threads: 16 rows 0.62-0.78 -> 0.54-0.56 ms, the compute alone 0.41).
// `line` has no branch (past the record it fetches its last line again): with a test in the
// unrolled product loops, GCC split them at every call and copied each accumulator between
// registers at each step, a move per product (Q4_K from L2, 16 rows: 915-960 -> 880 cycles a
// record, one row 160-238 -> 164-168; an Emerald Rapids core).
class RecordPrefetch {
 public:
#if defined(DRAFTSMAN_PREFETCH_NTA)
  static constexpr int AHEAD = 4;
  static constexpr auto HINT = _MM_HINT_NTA;
#else
  static constexpr int AHEAD = 8;
  static constexpr auto HINT = _MM_HINT_T1;
#endif
  // The record AHEAD records past `record`: a stream of one group's records after another.
  RecordPrefetch(const uint8_t* record, int bytes)
      : RecordPrefetch(reinterpret_cast<const char*>(record + AHEAD * bytes), bytes) {}
  // `target` itself, a record of `bytes` (paired groups read two streams: pair_ahead).
  static RecordPrefetch at(const uint8_t* target, int bytes) {
    return RecordPrefetch(reinterpret_cast<const char*>(target), bytes);
  }
  void line() {
    _mm_prefetch(std::min(next_, last_), HINT);
    next_ += 64;
  }
  void rest() {
    for (; next_ <= last_; next_ += 64) _mm_prefetch(next_, HINT);
  }

 private:
  RecordPrefetch(const char* first, int bytes) : next_(first), last_(first + bytes - 1) {}
  const char* next_;
  const char* last_;
};

// A row's int8 activations in its block (the tiles' A operand, the vectors' broadcasts).
inline const uint8_t* quants(const Q8Block* xb) {
  return reinterpret_cast<const uint8_t*>(xb) + offsetof(Q8Block, q);
}

// The tile configuration of every path: tmm0/1 two sums (`rows` x 16 int32), tmm2/3 A
// (`rows` x k int8), tmm4-7 B (k / 4 x 64: k x 16 columns in VNNI order), the operands of
// two runs of k. k = 64 (a tile product's most) but for Q8_0, whose blocks of 32 k each have
// their own scale (byte_tiles.h). Tile state is per thread: each thread configures its own.
#if DRAFTSMAN_AMX
inline void configure_tiles(int rows, int k = 64) {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = static_cast<uint16_t>(t < 2 ? 64 : k);
  }
  for (int t = 4; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(k / 4);
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}
#endif

// How a row adds up its scaled sub-block sums, isum = sum_j sc_j C_j (C_j exact int32).
// IntSum: in int32 (vpmulld + vpaddd, 3 uops a sub-block), the integer the tiles compute.
// FloatSum: float fused multiply-adds (vcvtdq2ps + vfmadd, 2 uops), for the vectors where no
// tiles run: C_j sc_j is an exact float (Q4_K < 2^22, Q6_K < 2^23), and so is each partial
// sum below 2^24, so FloatSum gives IntSum's float(isum) bit for bit unless a partial sum
// passes 2^24 (possible only near the bounds, Q4_K 2^24.9 and Q6_K 2^27: activations of all
// +-127 against extreme weights and scales). Either way a row's arithmetic is its own, in a
// fixed order: batch invariance holds on each. A model takes one of them for all its row
// counts (IntSum where AMX tiles take 16 rows and more).
struct IntSum {
  static constexpr bool HIGH_IN_PLACE = false;
  using Vec = __m512i;
  using Factor = __m512i;
  static Factor factor(__m512i sc) { return sc; }
  static Vec zero() { return _mm512_setzero_si512(); }
  static Vec add(Vec s, __m512i c, Factor sc) { return _mm512_add_epi32(s, _mm512_mullo_epi32(c, sc)); }
  static __m512 to_float(Vec s) { return _mm512_cvtepi32_ps(s); }
};

struct FloatSum {
  static constexpr bool HIGH_IN_PLACE = true;  // Q4_K's high nibbles as 16 q: factors sc / 16
  using Vec = __m512;
  using Factor = __m512;
  static Factor factor(__m512i sc) { return _mm512_cvtepi32_ps(sc); }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec add(Vec s, __m512i c, Factor sc) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), sc, s); }
  static __m512 to_float(Vec s) { return s; }
};

// A Q4_K record's per-column factors, widened for the vector and tile paths: sub-block
// scales as Sum's factors (odd sub-blocks' divided by 16 where Sum takes their nibbles in
// place: exact, a power of 2), the mins of sub-block pairs as int16 pairs, d and dmin as
// floats.
template <typename Sum>
struct Q4kScales {
  typename Sum::Factor sc[8];
  __m512i mins[4];
  __m512 d, dmin;

  explicit Q4kScales(const uint8_t* w) {
    for (int j = 0; j < 8; ++j) {
      sc[j] = Sum::factor(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + OFF_SC + 16 * j))));
      if constexpr (Sum::HIGH_IN_PLACE) {
        if (j % 2) sc[j] = _mm512_mul_ps(sc[j], _mm512_set1_ps(1.0f / 16));
      }
    }
    for (int t = 0; t < 4; ++t) {
      mins[t] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + OFF_MIN + 32 * t)));
    }
    d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + OFF_D)));
    dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + OFF_DMIN)));
  }
};

// A Q6_K record's per-column factors: sub-block scales as Sum's factors, d as floats.
template <typename Sum>
struct Q6kScales {
  typename Sum::Factor sc[16];
  __m512 d;

  explicit Q6kScales(const uint8_t* w) {
    for (int j = 0; j < 16; ++j) {
      sc[j] = Sum::factor(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + Q6_OFF_SC + 16 * j))));
    }
    d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + Q6_OFF_D)));
  }
};

// Row m's share of one Q4_K block, after its sums (isum as a float, exact): the same float
// code for every path.
inline void q4k_finish_row(__m512 isum, const __m512i* mins, __m512 d, __m512 dmin, const Q8Block& xb,
                           float* acc) {
  __m512i msum = _mm512_setzero_si512();
  for (int t = 0; t < 4; ++t) {  // (psum_2t, psum_2t+1) as two int16, broadcast
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(msum) : "v"(mins[t]), "m"(*reinterpret_cast<const int32_t*>(xb.psums + 2 * t)));
  }
  const __m512 dx = _mm512_set1_ps(xb.d);
  const __m512 a = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), isum, _mm512_loadu_ps(acc));
  _mm512_storeu_ps(acc, _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(msum), a));
}

// Row m's share of one Q6_K block after its sum (a float, exact), the same for every path.
inline void q6k_finish_row(__m512 isum, __m512 d, const Q8Block& xb, float* acc) {
  _mm512_storeu_ps(acc, _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb.d)), isum, _mm512_loadu_ps(acc)));
}

// c += q . x: one vpdpbusd of 64 unsigned weights against the 4 signed activations at x,
// broadcast from memory inside the instruction ({1to16}). Compilers emit the intrinsic's
// _mm512_set1_epi32 as a separate vpbroadcastd, a uop and a register more per product; the
// embedded broadcast measured 48-53 -> 73-78 multiply-adds a cycle for 8 rows from L1 (an
// Emerald Rapids core, 2 vpdpbusd a cycle peak = 128), the same arithmetic.
inline __m512i dpbusd_broadcast(__m512i c, __m512i q, const uint8_t* x) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(c) : "v"(q), "m"(*reinterpret_cast<const int32_t*>(x)));
  return c;
}

// For each of R rows, one vpdpbusd of unpacked weights q0 (sub-block 2p) and q1 (2p + 1)
// against the row's 4 activations at x (sub-block 2p) and x + half (2p + 1), into c[m][0],
// c[m][1]; row m's activations start x + m * xstride.
template <int R>
inline void rows_dpbusd(const uint8_t* x, int64_t xstride, int half, __m512i q0, __m512i q1,
                        __m512i (*c)[2]) {
  for (int m = 0; m < R; ++m) {
    c[m][0] = dpbusd_broadcast(c[m][0], q0, x + m * xstride);
    c[m][1] = dpbusd_broadcast(c[m][1], q1, x + m * xstride + half);
  }
}

}  // namespace draftsman_amx
#endif
