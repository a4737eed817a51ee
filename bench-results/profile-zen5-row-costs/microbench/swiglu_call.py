import sys, time, statistics, torch, numpy as np
from draftsman.models.int8_linear import Int8RecordsMatrix
from draftsman.kernels.native import byte_records; byte_records()
torch.set_num_threads(2)
rng = np.random.default_rng(0)
m = Int8RecordsMatrix(torch.from_numpy(rng.standard_normal((9728, 896), dtype=np.float32)))
with torch.inference_mode():
  for rows in (1, 8, 16):
    x = torch.randn(rows, 896, dtype=torch.bfloat16)
    f = lambda: torch.ops.draftsman.kquant_records_swiglu(x, m.packed, 1000, 9728, 0)
    for _ in range(200): f()
    ts = []
    for _ in range(2000):
        s = time.perf_counter(); f(); ts.append(time.perf_counter() - s)
    ts.sort(); print(rows, "p10 %.1f med %.1f us" % (ts[200]*1e6, ts[1000]*1e6))
