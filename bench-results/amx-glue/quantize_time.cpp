// ns a block of the int8 activation quantisation (kquant_blocks.h: quantize_row), 16 rows of
// K = 4864 (the 0.5B's down projection input) in bf16 and in float32, one thread, best of 300
// x 20 passes. An A/B of two commits is this file built against each one's kernels folder:
//   g++ -O3 -std=c++20 -march=native -ffp-contract=off -w -I<torch include dirs> \
//       -I<worktree>/src/draftsman/kernels -o quantize_time quantize_time.cpp -L<torch lib> -lc10
#include "kquant_blocks.h"

#include <chrono>
#include <cstdio>
#include <random>

using draftsman_kquant::Q8Block;
using draftsman_kquant::QK;

template <typename T>
double ns_a_block(int k) {
  const int rows = 16, nb = (k + QK - 1) / QK;
  std::vector<T> x(static_cast<size_t>(rows) * k);
  std::mt19937 g(1);
  std::normal_distribution<float> normal(0, 1);
  for (auto& v : x) v = T(normal(g));
  std::vector<Q8Block> out(static_cast<size_t>(rows) * nb);
  double best = 1e9;
  for (int rep = 0; rep < 300; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int pass = 0; pass < 20; ++pass) {
      for (int r = 0; r < rows; ++r) draftsman_kquant::quantize_row(x.data() + r * k, k, nb, out.data() + r * nb, 1);
    }
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / (20.0 * rows * nb));
  }
  return best;
}

int main() {
  std::printf("bf16 %.1f ns a block, float32 %.1f\n", ns_a_block<c10::BFloat16>(4864), ns_a_block<float>(4864));
}
