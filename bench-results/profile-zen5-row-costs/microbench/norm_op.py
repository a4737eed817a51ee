import time, torch
from draftsman.kernels import native
native.kquant_available()
import draftsman.kernels.native as n
for th in (1, 2):
    torch.set_num_threads(th)
    for rows in (1, 8, 16):
        for h in (896, 1536):
            x = torch.randn(rows, h).bfloat16(); d = torch.randn(rows, h).bfloat16(); w = torch.randn(h).bfloat16()
            for _ in range(100): torch.ops.draftsman.add_rms_norm(x, d, w, 1e-6)
            ts = []
            for _ in range(2000):
                t = time.perf_counter(); torch.ops.draftsman.add_rms_norm(x, d, w, 1e-6); ts.append(time.perf_counter() - t)
            ts.sort()
            print(th, rows, h, f"{ts[len(ts)//10]*1e6:.1f} {ts[len(ts)//2]*1e6:.1f} us")
