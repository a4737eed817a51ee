import torch, time, sys
from draftsman.kernels import native; native.kquant_available()
from draftsman.models.int8_linear import Int8RecordsMatrix
torch.set_num_threads(2)
for (n,k) in ((896,896),(1152,896),(1536,1536),(16,896)):
    m = Int8RecordsMatrix(torch.randn(n, k))
    for rows in (1, 8, 16):
        x = torch.randn(rows, k)
        for _ in range(200): m(x)
        ts=[]
        for _ in range(7):
            t=time.perf_counter()
            for _ in range(300): m(x)
            ts.append((time.perf_counter()-t)/300*1e6)
        print(n,k, rows, f"{min(ts):.1f} us")
