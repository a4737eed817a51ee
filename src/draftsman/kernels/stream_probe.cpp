// The memory stream a forward's weights come in on: `stream_read(buf)` reads a byte buffer far
// larger than the caches once, each thread one contiguous share, and returns the wrapping
// sum of its 64-bit words (so the reads cannot be dropped). Timed from Python
// (profiling.memory_stream_gbs), it says how fast this machine streams memory right now,
// apart from any model or kernel: a shared host's stream moves between states within minutes
// (a 2-core Zen 5 EPYC: ~50 and ~80 GB/s), and a one-row forward, which streams its weights,
// moves with it, so a verify-cost curve v(n) = L(n) / L(1) is read against it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// The wrapping sum of n words, in 8 independent sums (a vector's worth a step, so the loop
// issues loads rather than waits on one add chain).
uint64_t words_sum(const uint64_t* w, int64_t n) {
  uint64_t s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) s[j] += w[i + j];
  }
  for (; i < n; ++i) s[0] += w[i];
  uint64_t total = 0;
  for (uint64_t v : s) total += v;
  return total;
}

// buf: contiguous uint8, a multiple of 8 bytes. Returns a one-element int64 tensor.
at::Tensor stream_read(const at::Tensor& buf) {
  TORCH_CHECK(buf.scalar_type() == at::kByte && buf.is_contiguous() && buf.numel() % 8 == 0,
              "stream_read: buf must be a contiguous uint8 tensor of whole 8-byte words");
  const auto* w = reinterpret_cast<const uint64_t*>(buf.data_ptr<uint8_t>());
  const int64_t n = buf.numel() / 8, threads = at::get_num_threads();
  std::vector<uint64_t> part(static_cast<size_t>(threads), 0);
  // one share a thread, as the records kernels split a matrix: each streams its own region
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = n * t / threads, last = n * (t + 1) / threads;
      part[static_cast<size_t>(t)] = words_sum(w + first, last - first);
    }
  });
  uint64_t total = 0;
  for (uint64_t v : part) total += v;
  at::Tensor out = at::empty({1}, buf.options().dtype(at::kLong));
  std::memcpy(out.data_ptr<int64_t>(), &total, sizeof(total));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftsman, m) { m.def("stream_read(Tensor buf) -> Tensor"); }

TORCH_LIBRARY_IMPL(draftsman, CPU, m) { m.impl("stream_read", &stream_read); }
