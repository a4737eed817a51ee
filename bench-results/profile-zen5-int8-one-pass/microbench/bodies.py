"""The asm loop body of shuf.cpp's microbenchmark: 4 k-rows, each 2 prefetches, 2 weight loads
(sub-blocks 2p, 2p + 1) and one vpdpbusd per row and sub-block. Rows below S take their 4
activations from vpshufd of a 16-byte lane broadcast (loaded once per 4 k-rows), the others
from a broadcast load inside the vpdpbusd.

    python bodies.py S 8    # an 8-row pass, two accumulators a row (the kernel before)
    python bodies.py S 16   # a 16-row pass, one accumulator a row (i8_many_rows)
"""
import sys

S, ROWS = int(sys.argv[1]), int(sys.argv[2])
W = ROWS if ROWS == 16 else 16  # the two weight registers; lane sources follow them


def acc(m: int, s: int) -> int:
    return m if ROWS == 16 else 2 * m + s


body = [f"vbroadcasti32x4 {m * 256 + 32 * s}(%%rdi), %%zmm{W + 2 + 2 * m + s}"
        for m in range(S) for s in range(2)]
for r in range(4):
    body += [f"prefetchnta {2048 + 128 * r}(%%rsi)", f"prefetchnta {2048 + 128 * r + 64}(%%rsi)",
             f"vmovdqu64 {128 * r}(%%rsi), %%zmm{W}", f"vmovdqu64 {128 * r + 64}(%%rsi), %%zmm{W + 1}"]
    for s in range(2):
        for m in range(ROWS):
            if m < S:
                t = 30 + (m % 2 if ROWS == 16 else s)
                body += [f"vpshufd ${0x55 * r}, %%zmm{W + 2 + 2 * m + s}, %%zmm{t}",
                         f"vpdpbusd %%zmm{t}, %%zmm{W + s}, %%zmm{acc(m, s)}"]
            else:
                body.append(f"vpdpbusd {m * 256 + 32 * s + 4 * r}(%%rdi)%{{1to16%}}, %%zmm{W + s}, "
                            f"%%zmm{acc(m, s)}")
print("\\n\\t".join(body))
