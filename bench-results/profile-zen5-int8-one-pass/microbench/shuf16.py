# 16-row pass, one accumulator per row; per k-step: 2 weight loads (sub-blocks 2p, 2p+1), 2 prefetches, 32 products
import sys
S=int(sys.argv[1]); R=int(sys.argv[2]) if len(sys.argv)>2 else 16
L=[]
for m in range(S):
    for s in range(2):
        L.append(f"vbroadcasti32x4 {m*256+32*s}(%%rdi), %%zmm{R+2+2*m+s}")
for r in range(4):
    L.append(f"prefetchnta {2048+128*r}(%%rsi)"); L.append(f"prefetchnta {2048+128*r+64}(%%rsi)")
    L.append(f"vmovdqu64 {128*r}(%%rsi), %%zmm{R}")
    L.append(f"vmovdqu64 {128*r+64}(%%rsi), %%zmm{R+1}")
    for s in range(2):
      for m in range(R):
        if m<S:
            src=R+2+2*m+s; t=30+(m%2)
            L.append(f"vpshufd ${[0,0x55,0xAA,0xFF][r]}, %%zmm{src}, %%zmm{t}")
            L.append(f"vpdpbusd %%zmm{t}, %%zmm{R+s}, %%zmm{m}")
        else:
            L.append(f"vpdpbusd {m*256+32*s+4*r}(%%rdi)%{{1to16%}}, %%zmm{R+s}, %%zmm{m}")
print("\\n\\t".join(L))
