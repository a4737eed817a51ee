import torch, time, statistics
from draftsman.kernels import native; native.kquant_available()
from draftsman.models.int8_linear import Int8RecordsMatrix
torch.set_num_threads(2)
for k in (1536, 8960):
    m = Int8RecordsMatrix(torch.randn(16, k))
    for rows in (1, 8, 16):
        x = torch.randn(rows, k)
        for _ in range(200): m(x)
        ts=[]
        for _ in range(7):
            t=time.perf_counter()
            for _ in range(500): m(x)
            ts.append((time.perf_counter()-t)/500*1e6)
        print(k, rows, f"{min(ts):.1f} us")
