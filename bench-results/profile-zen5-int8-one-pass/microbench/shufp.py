# generate asm loop body: 4 k-steps x (2 weight loads + 8 rows x 2 sub-blocks products)
# rows < S use shuffle broadcasts from lane-broadcast loads; others embedded bcast
import sys
S=int(sys.argv[1]); op=sys.argv[2] if len(sys.argv)>2 else "vpshufd"
L=[]
# rsi = weights base (L1), rdi = x base; xstride 256
if S:
    for m in range(S):
        for s in range(2):
            L.append(f"vbroadcasti32x4 {m*256+32*s}(%%rdi), %%zmm{18+2*m+s}")
for r in range(4):
    L.append(f"prefetchnta {2048+128*r}(%%rsi)"); L.append(f"prefetchnta {2048+128*r+64}(%%rsi)")
    L.append(f"vmovdqu64 {128*r}(%%rsi), %%zmm16")
    L.append(f"vmovdqu64 {128*r+64}(%%rsi), %%zmm17")
    for m in range(8):
        for s in range(2):
            acc=2*m+s
            if m<S:
                src=18+2*m+s
                if op=="vpshufd":
                    imm=[0x00,0x55,0xAA,0xFF][r]
                    L.append(f"vpshufd ${imm}, %%zmm{src}, %%zmm{30+s}")
                L.append(f"vpdpbusd %%zmm{30+s}, %%zmm{16+s}, %%zmm{acc}")
            else:
                L.append(f"vpdpbusd {m*256+32*s+4*r}(%%rdi)%{{1to16%}}, %%zmm{16+s}, %%zmm{acc}")
print("\\n\\t".join(L))
