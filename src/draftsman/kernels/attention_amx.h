// Attention on AMX-BF16 tiles (kernels/attention_amx.cpp), called by attention_ops.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <functional>

namespace draftsman_attention {

// Whether attend_amx runs here: built with AMX-BF16 (and AVX512-BF16) and granted by Linux.
bool amx_attention_available();

// out [B, T, Hq D] = softmax(q k^T scale + bias) v for bf16 q [B, Hq, T, D] and keys, values
// [B, Hkv, S, D] (D a multiple of 64, the last dimension contiguous), as short_attention;
// only where amx_attention_available(). `head_prologue(bi, g)`, where given, runs at the start
// of the task for batch row bi and KV head g before it reads q, the keys or the values; given
// only where one task holds all new rows of its KV head (T <= AMX_ROWS_PER_TASK).
void attend_amx(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                const c10::optional<at::Tensor>& bias, float scale, at::Tensor& out,
                const std::function<void(int64_t, int64_t)>& head_prologue = {});

// new rows a task of attend_amx takes at most (one tile of query rows per head of a group)
constexpr int64_t AMX_ROWS_PER_TASK = 16;

}  // namespace draftsman_attention
