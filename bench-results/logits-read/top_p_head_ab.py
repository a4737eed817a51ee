"""TOP_P_HEAD 256 against 1024, interleaved in one process (3 rounds), on top_p_time.py's
logits: ms per `probabilities` call (medians of 7 runs of 10 calls)."""
from call_time import ms
from top_p_time import CONFIGS, real_logits

from draftsman import sampling
from draftsman.sampling import probabilities

logits = real_logits()
for config in CONFIGS:
    for rows in (1, 16):
        x = logits[:rows]
        times: dict[int, list[float]] = {256: [], 1024: []}
        for _ in range(3):
            for head in times:
                sampling.TOP_P_HEAD = head
                times[head].append(ms(lambda x=x, c=config: probabilities(x, c), 10))
        cells = [f"head {h}: " + " / ".join(f"{t:.2f}" for t in ts) for h, ts in times.items()]
        print(f"T {config.temperature}, top-k {config.top_k}, top-p {config.top_p}, {rows} rows:",
              "; ".join(cells))
