import sys, time, torch, numpy as np
from draftsman.models.int8_linear import Int8RecordsMatrix
from draftsman.kernels.native import byte_records; byte_records()
torch.set_num_threads(2)
rows, out, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
m = Int8RecordsMatrix(torch.from_numpy(np.random.default_rng(0).standard_normal((out, 896), dtype=np.float32)))
x = torch.randn(rows, 896, dtype=torch.bfloat16)
with torch.inference_mode():
    for _ in range(1000): m(x)
    s = time.perf_counter()
    for _ in range(n): m(x)
    print(rows, "%.2f us" % ((time.perf_counter() - s) / n * 1e6))
