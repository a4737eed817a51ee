import torch, sys, time, statistics
from draftsman.models.loader import load_model
from draftsman.store.resolve import resolve_gguf, resolve_model
from draftsman.models.quant_linear import KQuantRecordsMatrix
torch.set_num_threads(2)
name="qwen2.5-coder-1.5b-instruct"
model = load_model(resolve_model(name, pull=False), "q4", gguf=resolve_gguf(name, pull=False))
gu = [m for n, m in model.named_modules() if isinstance(m, KQuantRecordsMatrix) and "gate_up" in n]
op = torch.ops.draftsman
for rows in (1, 4, 8, 16):
    x = torch.randn(rows, 1536)
    res = {"mm": [], "separate": [], "swiglu": []}
    for rep in range(15):
        for mode in res:
            t0 = time.perf_counter()
            if mode == "mm":
                for m in gu: op.kquant_records_mm(x, *m.record_operands())
            elif mode == "separate":
                for m in gu: op.silu_mul(op.kquant_records_mm(x, *m.record_operands()))
            else:
                for m in gu: op.kquant_records_swiglu(x, *m.record_operands())
            res[mode].append((time.perf_counter() - t0) * 1e3)
    print(rows, "  ".join(f"{k}: best {min(v[2:]):.2f} med {statistics.median(v[2:]):.2f}" for k, v in res.items()))
