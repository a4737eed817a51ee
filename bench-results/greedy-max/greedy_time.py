"""ms per call of Tensor.argmax(-1) against max(-1).indices (greedy_tokens' CPU form) on
logits of the 1.5B / 0.5B vocabulary, medians of 7 runs of 50 calls each, 2 threads."""
import statistics
import time

import torch

torch.set_num_threads(2)


def ms(f, n: int = 50) -> float:
    f()
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(n):
            f()
        runs.append((time.perf_counter() - start) / n * 1e3)
    return statistics.median(runs)


print("| dtype | rows | argmax(-1) ms | max(-1).indices ms |")
print("|---|---|---|---|")
for dtype in (torch.bfloat16, torch.float32):
    for rows in (1, 4, 8, 16):
        x = torch.randn(rows, 151936).to(dtype)
        assert torch.equal(x.argmax(-1), x.max(-1).indices)
        argmax, top = ms(lambda x=x: x.argmax(-1)), ms(lambda x=x: x.max(-1).indices)
        print(f"| {str(dtype)[6:]} | {rows} | {argmax:.3f} | {top:.3f} |")
