// Attention on AMX-BF16 tiles (kernels/attention_amx.cpp), called by attention_ops.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace draftsman_attention {

// Whether attend_amx runs here: built with AMX-BF16 (and AVX512-BF16) and granted by Linux.
bool amx_attention_available();

// out [B, T, Hq D] = softmax(q k^T scale + bias) v for bf16 q [B, Hq, T, D] and keys, values
// [B, Hkv, S, D] (D a multiple of 64, the last dimension contiguous), as short_attention;
// only where amx_attention_available().
void attend_amx(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                const c10::optional<at::Tensor>& bias, float scale, at::Tensor& out);

}  // namespace draftsman_attention
