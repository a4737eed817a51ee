import sys, time, torch
from draftsman.models.loader import load_model
from draftsman.store.resolve import resolve_gguf, resolve_model
torch.set_num_threads(2)
name, dtype, rows, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model = load_model(resolve_model(name, pull=False), dtype, gguf=resolve_gguf(name, pull=False))
ctx = 256
cache = model.new_cache(ctx + 32)
model(torch.randint(0, 1000, (1, ctx)), torch.arange(ctx)[None], cache, logits_at=slice(-1, None))
ids = torch.zeros(1, rows, dtype=torch.long); pos = torch.arange(ctx, ctx + rows)[None]
for _ in range(5): model(ids, pos, cache, logits_at=slice(None), start=ctx)
open("/tmp/w/marker", "w").write("go")
s = time.perf_counter()
for _ in range(n): model(ids, pos, cache, logits_at=slice(None), start=ctx)
print(rows, "ms/forward %.2f" % ((time.perf_counter() - s) / n * 1e3), file=sys.stderr)
