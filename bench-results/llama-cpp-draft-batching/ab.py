"""A/B in one process: llama.cpp batched requests drafting with the 0.5B, their drafts
lent sequences of the draft's batch context (together) or not (each drafts alone)."""
import json, statistics, sys, time
import draftsman
from draftsman.batching import scheduler as sched
from draftsman.bench.datasets import load_dataset

real = sched.lend_draft_caches
engine = draftsman.load("qwen2.5-coder-1.5b-instruct", backend="llama.cpp", threads=2,
                        draft="qwen2.5-coder-0.5b-instruct")
prompts = [x.text for n in ("humaneval", "mt-bench") for x in load_dataset(n, limit=2)]
kw = dict(method="speculative", draft="qwen2.5-coder-0.5b-instruct", gamma=3,
          max_new_tokens=48)
engine.generate_many(prompts[:2], parallel=2, **{**kw, "max_new_tokens": 8})
rows = {}
for r in range(2):
    for mode in ("alone", "together"):
        sched.lend_draft_caches = real if mode == "together" else (lambda *a: None)
        for par in (1, 4):
            t0 = time.perf_counter()
            res = engine.generate_many(prompts, parallel=par, **kw)
            dt = time.perf_counter() - t0
            toks = sum(len(x.token_ids) for x in res)
            rows.setdefault((mode, par), []).append((toks, dt, [x.token_ids for x in res]))
            print(mode, par, toks / dt, file=sys.stderr, flush=True)
out = []
for (mode, par), v in rows.items():
    out.append({"drafts": mode, "parallel": par, "tokens": v[0][0],
                "seconds": statistics.median(x[1] for x in v),
                "tok_s": v[0][0] / statistics.median(x[1] for x in v)})
same = all(rows[("alone", p)][0][2] == rows[("together", p)][0][2] for p in (1, 4))
print(json.dumps({"rows": out, "outputs_equal": same}, indent=1))
