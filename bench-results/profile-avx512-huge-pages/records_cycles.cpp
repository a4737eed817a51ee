// Cycles per record (16 columns x 256 k) of the records kernel's vector path, one thread,
// clocked by a chain of imul (core cycles). Arguments: blocks per group, groups, GGML type
// (12 Q4_K, 14 Q6_K), copies (1: the records stay in L2; 24 x 280 groups: streamed from
// memory); HUGE=1 in the environment asks for 2 MiB pages. Build (torch's headers and libs):
//   g++ -O3 -std=c++20 -ffp-contract=off -fopenmp -march=native -w -I$TORCH/include \
//     -I$TORCH/include/torch/csrc/api/include \
//     -DKERNEL_FILE='"src/draftsman/kernels/gguf_matmul_records.cpp"' records_cycles.cpp \
//     -L$TORCH/lib -lc10 -ltorch_cpu -ltorch -Wl,-rpath,$TORCH/lib
//   ./a.out 6 8 12 1;  HUGE=1 ./a.out 6 280 12 24
#include KERNEL_FILE
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
static double now(){ return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static double clock_ghz(){ long N=20000000; uint64_t x=3; double t0=now();
  for(long i=0;i<N;i++){ __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x)); }
  return 12.0*N/(now()-t0)*1e-9; }
int main(int argc, char** argv){
  const int NB = argc > 1 ? atoi(argv[1]) : 6;     // blocks per group (k / 256)
  const int G = argc > 2 ? atoi(argv[2]) : 8;      // groups (16 columns each)
  const int qtype = argc > 3 ? atoi(argv[3]) : 12;
  const int copies = argc > 4 ? atoi(argv[4]) : 1;
  const int rec = record_bytes(qtype);
  const size_t wbytes = size_t(copies) * G * NB * rec + 64;
  uint8_t* wraw = static_cast<uint8_t*>(aligned_alloc(1 << 21, (wbytes + (1 << 21) - 1) & ~size_t((1 << 21) - 1)));
  if (getenv("HUGE")) madvise(wraw, wbytes, MADV_HUGEPAGE);
  std::vector<uint8_t> dummy; struct W { uint8_t* p; size_t n; uint8_t* data() { return p; } uint8_t* begin() { return p; } uint8_t* end() { return p + n; } } w{wraw, wbytes};
  srand(1); for (auto& b : w) b = rand() & 255;
  for (int g = 0; g < copies * G * NB; ++g) {
    uint16_t* h = reinterpret_cast<uint16_t*>(w.data() + size_t(g) * rec);
    for (int i = 0; i < (qtype == 12 ? 32 : 16); ++i) h[i] = 0x3C00;
  }
  std::vector<Q8Block> x(16 * NB);
  for (auto& b : x) { for (int i = 0; i < QK; ++i) b.q[i] = (rand() % 255) - 127; b.d = 0.01f; for (auto& s : b.bsums) s = rand() % 100; for (auto& s : b.psums) s = rand() % 100; }
  alignas(64) static float acc[17 * 16];
  double ghz = clock_ghz();
  for (int rows : {1, 4, 8, 12, 16}) {
    double best = 1e9; long N = std::max(1, 20000 / G / copies) * copies;
    for (int rep = 0; rep < 7; ++rep) {
      double t0 = now();
      for (long i = 0; i < N; ++i)
        for (int g = 0; g < G; ++g) {
          const uint8_t* wg = w.data() + (size_t(i % copies) * G + g) * NB * rec;
          if (qtype == 12) group<Q4kPath>(wg, x.data(), NB, NB, 1, rows, false, acc);
          else group<Q6kPath>(wg, x.data(), NB, NB, 1, rows, false, acc);
        }
      best = std::min(best, now() - t0);
    }
    double cyc = best * ghz * 1e9 / (double(N) * G * NB);
    printf("qtype %d rows %2d: %6.0f cycles/record  %5.1f cycles/record-row  %5.1f MAC/cycle\n", qtype, rows, cyc, cyc / rows, 4096.0 * rows / cyc);
  }
  printf("(clock %.2f GHz, acc %g)\n", ghz, acc[0]);
}
