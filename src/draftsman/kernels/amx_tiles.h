// What the AMX kernels share: Linux's permission to use the tiles, and the tile
// configuration record (kernels/gguf_matmul_records.cpp, kernels/attention_amx.cpp).
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace draftsman_amx {

// Linux hands out AMX state on request, once per process (arch_prctl ARCH_REQ_XCOMP_PERM).
inline bool amx_permitted() {
#if defined(__AMX_TILE__)
  static const bool ok = [] {
    constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

// ldtilecfg's 64-byte record (palette 1): per tile register, its rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace draftsman_amx
