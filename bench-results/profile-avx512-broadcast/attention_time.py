import torch, time
import draftsman.kernels.native as nat
nat._load()
torch.set_num_threads(2)
def t(T,S,dt=torch.bfloat16,rep=200):
    q=torch.randn(1,12,T,128,dtype=dt); k=torch.randn(1,2,S,128,dtype=dt); v=torch.randn(1,2,S,128,dtype=dt)
    f=lambda: torch.ops.draftsman.short_attention(q,k,v,None,0.088)
    for _ in range(5): f()
    best=1e9
    for _ in range(rep):
        s=time.perf_counter(); f(); best=min(best,time.perf_counter()-s)
    return best*1e6
for S in (272,1024):
    print(S, {T: round(t(T,S),1) for T in (1,2,4,8,16)}, 'us per layer')
