#include "kquant_blocks.h"  // build with -I src/draftsman/kernels
#include <ATen/ATen.h>
#include <chrono>
#include <cstdio>
using namespace draftsman_kquant;
static double now(){ return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
  at::Tensor x = at::randn({16, 8960}).to(at::kBFloat16);
  const c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  std::vector<Q8Block> out(560);
  double best = 1e9;
  for (int rep = 0; rep < 20; ++rep) {
    double t0 = now();
    for (int i = 0; i < 100; ++i) for (int b = 0; b < 560; ++b) quantize_block(xp + 256 * b, out[b]);
    best = std::min(best, (now() - t0) / 100);
  }
  printf("560 blocks: %.1f us, %.1f ns/block\n", best * 1e6, best * 1e9 / 560);
  best = 1e9;
  for (int rep = 0; rep < 20; ++rep) {
    double t0 = now();
    for (int i = 0; i < 100; ++i) for (int r = 0; r < 16; ++r) quantize_row(xp + 8960 * r, 8960, 35, out.data() + 35 * r);
    best = std::min(best, (now() - t0) / 100);
  }
  printf("16 rows: %.1f us\n", best * 1e6);
}
