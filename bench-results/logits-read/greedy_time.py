"""ms per call of Tensor.argmax(-1), max(-1).indices and the greedy_rows kernel
(greedy_tokens' CPU forms) on logits of the 1.5B / 0.5B vocabulary, medians of 7 runs of 50
calls each, 2 threads."""

import torch
from call_time import ms

from draftsman.kernels import native

torch.set_num_threads(2)


assert native.kquant_available(), native.unavailable_reason()
print("| dtype | rows | argmax(-1) ms | max(-1).indices ms | greedy_rows ms |")
print("|---|---|---|---|---|")
for dtype in (torch.bfloat16, torch.float32):
    for rows in (1, 4, 8, 16):
        x = torch.randn(rows, 151936).to(dtype)
        assert torch.equal(x.argmax(-1), x.max(-1).indices)
        assert torch.equal(x.argmax(-1), torch.ops.draftsman.greedy_rows(x))
        argmax, top = ms(lambda x=x: x.argmax(-1), 50), ms(lambda x=x: x.max(-1).indices, 50)
        ours = ms(lambda x=x: torch.ops.draftsman.greedy_rows(x), 50)
        print(f"| {str(dtype)[6:]} | {rows} | {argmax:.3f} | {top:.3f} | {ours:.3f} |")
