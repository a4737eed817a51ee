"""ms per draw from a 151,936-token distribution (dense, and 50 tokens of mass), torch.multinomial
against sampling.inverse_cdf_draw with its one seeded uniform, 2 threads."""
import torch
from call_time import ms

from draftsman.sampling import inverse_cdf_draw

torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
dense = torch.softmax(torch.randn(151936, generator=g), -1)
sparse = torch.zeros(151936)
sparse[torch.randint(0, 151936, (50,), generator=g)] = torch.rand(50, generator=g)
print("| distribution | torch.multinomial ms | inverse_cdf_draw ms |")
print("|---|---|---|")
for name, p in (("dense", dense), ("50 tokens", sparse)):
    multinomial = ms(lambda p=p: torch.multinomial(p, 1, generator=g)[0], 200)
    inverse = ms(lambda p=p: inverse_cdf_draw(p, torch.rand((), generator=g)), 200)
    print(f"| {name} | {multinomial:.3f} | {inverse:.3f} |")
