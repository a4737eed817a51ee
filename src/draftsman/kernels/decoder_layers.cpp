// A Llama-family decoder's layers on the fused CPU ops in one call: the calls
// models/fused_cpu_step.py makes for each layer from Python (the QKV product, RoPE + cache
// write + attention, the output product, a residual add with the norm after it, the
// SwiGLU product, the down product, the next residual add and norm), made here in the same
// order on the same tensors through the same registered ops, so the bits are the same.
// What it saves is each call's Python frame, argument conversion and Python-side dispatch:
// on the 0.5B's one-row step (24 layers, 7 calls each, ~7.6 ms) the main thread spent ~1 ms
// outside the kernels, most of it there, while the other thread waited for its next region.
//
// Operands, flat, layer after layer (FusedCpuStep's flat_layers builds them once):
//   tensors: the input norm's weight, the post-attention norm's weight, then for each of the
//            qkv, o, gate/up and down products its parts' records and its bias (an empty
//            tensor for none)
//   ints:    query heads, KV heads, then for each product: how it is called (0: its parts'
//            records calls writing their columns in turn, as QuantLinear.forward makes them;
//            1: one kquant_records_swiglu call, gate/up only), its part count, and each
//            part's qtype, n, tile_rows. A gate/up product called as 0 is followed by silu_mul.
//   floats:  the two norms' eps
//   starts:  where each layer's tensors and ints begin (2 a layer)
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "check_message.h"

namespace {

using Records = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t);
using RecordsInto = void(const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, at::Tensor, int64_t);
using Unary = at::Tensor(const at::Tensor&);
using Norm = at::Tensor(const at::Tensor&, const at::Tensor&, double);
using AddNorm = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, double);
using RopeAttention = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor, at::Tensor,
                                 int64_t, const std::optional<at::Tensor>&, double, int64_t, int64_t);

template <typename F>
c10::TypedOperatorHandle<F> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<F>();
}

// The registered ops, looked up once (they are registered when the library loads).
struct Ops {
  c10::TypedOperatorHandle<Records> mm = op<Records>("draftsman::kquant_records_mm");
  c10::TypedOperatorHandle<RecordsInto> mm_out = op<RecordsInto>("draftsman::kquant_records_mm_out");
  c10::TypedOperatorHandle<Records> swiglu = op<Records>("draftsman::kquant_records_swiglu");
  c10::TypedOperatorHandle<Unary> silu_mul = op<Unary>("draftsman::silu_mul");
  c10::TypedOperatorHandle<Norm> norm = op<Norm>("draftsman::rms_norm");
  c10::TypedOperatorHandle<AddNorm> add_norm = op<AddNorm>("draftsman::add_rms_norm");
  c10::TypedOperatorHandle<RopeAttention> attend = op<RopeAttention>("draftsman::rope_attention");
};

const Ops& ops() {
  static const Ops o;
  return o;
}

// Reads one layer's operands in order.
struct Operands {
  const at::Tensor* t;
  const int64_t* i;

  // x [M, K] times the next product, as QuantLinear computes it: one records call, or each
  // part's call writing its columns of one output (kquant_records_mm_out), then the bias in
  // place; a gate/up product's silu(gate) * up where `gate_up`.
  at::Tensor product(const at::Tensor& x, bool gate_up = false) {
    const int64_t how = *i++, parts = *i++;
    at::Tensor y;
    if (how == 1) {
      TORCH_CHECK(gate_up && parts == 1, "decoder_layers: only a one-part gate/up product is one SwiGLU call");
      y = ops().swiglu.call(x, *t++, i[0], i[1], i[2]);
      i += 3;
    } else if (parts == 1) {
      y = ops().mm.call(x, *t++, i[0], i[1], i[2]);
      i += 3;
    } else {
      int64_t n = 0;
      for (int64_t p = 0; p < parts; ++p) n += i[3 * p + 1];
      y = at::empty({x.size(0), n}, x.options());
      for (int64_t p = 0, col = 0; p < parts; ++p, i += 3) {
        ops().mm_out.call(x, *t++, i[0], i[1], i[2], y, col);
        col += i[1];
      }
    }
    const at::Tensor& bias = *t++;
    if (bias.numel() > 0) y.add_(bias);
    return gate_up && how == 0 ? ops().silu_mul.call(y) : y;
  }
};

// rows [B T, H] (contiguous) through layers first..last-1; returns the rows after them.
// k_cache, v_cache [L, B, Hkv, S, D]: layer i's new keys and values written at slots
// start..start+T; bias: the additive attention mask, as KVCache.write_rotated_and_attend
// takes it.
at::Tensor decoder_layers(const at::Tensor& rows, at::TensorList tensors, at::IntArrayRef ints,
                          at::ArrayRef<double> floats, at::IntArrayRef starts, int64_t first, int64_t last,
                          const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                          int64_t start, const std::optional<at::Tensor>& bias, double scale, int64_t batch) {
  const int64_t layers = static_cast<int64_t>(floats.size()) / 2;
  TORCH_CHECK(static_cast<int64_t>(starts.size()) == 2 * layers && 0 <= first && first <= last && last <= layers &&
                  last <= k_cache.size(0),
              draftsman_msg::text("decoder_layers: layers ", first, "..", last, " of operands for ", layers));
  TORCH_CHECK(rows.dim() == 2 && rows.is_contiguous() && batch > 0 && rows.size(0) % batch == 0,
              "decoder_layers: rows must be a contiguous [B T, H] tensor");
  if (first == last) return rows;
  const int64_t t = rows.size(0) / batch;
  const auto& o = ops();
  const auto layer = [&](int64_t i) {
    TORCH_CHECK(starts[2 * i] < static_cast<int64_t>(tensors.size()) && starts[2 * i + 1] < static_cast<int64_t>(ints.size()),
                "decoder_layers: a layer's operands start past the lists");
    return Operands{tensors.data() + starts[2 * i], ints.data() + starts[2 * i + 1]};
  };
  at::Tensor x = rows;
  at::Tensor normed = o.norm.call(x, *layer(first).t, floats[2 * first]);
  for (int64_t i = first; i < last; ++i) {
    Operands w = layer(i);
    const at::Tensor& norm2 = w.t[1];
    const int64_t n_heads = w.i[0], n_kv = w.i[1];
    w.t += 2;
    w.i += 2;
    const at::Tensor qkv = w.product(normed);
    at::Tensor k = k_cache.select(0, i), v = v_cache.select(0, i);
    const at::Tensor att = o.attend.call(qkv.view({batch, t, -1}), cos, sin, k, v, start, bias, scale, n_heads, n_kv);
    std::tie(x, normed) = o.add_norm.call(x, w.product(att.view({batch * t, -1})), norm2, floats[2 * i + 1]);
    const at::Tensor gated = w.product(normed, true);
    const at::Tensor mlp = w.product(gated);
    if (i + 1 == last) {
      x = at::add(x, mlp);
    } else {
      std::tie(x, normed) = o.add_norm.call(x, mlp, *layer(i + 1).t, floats[2 * (i + 1)]);
    }
  }
  return x;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftsman, m) {
  m.def("decoder_layers(Tensor rows, Tensor[] tensors, int[] ints, float[] floats, int[] starts, "
        "int first, int last, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, int start, "
        "Tensor? bias, float scale, int batch) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftsman, CPU, m) { m.impl("decoder_layers", &decoder_layers); }
