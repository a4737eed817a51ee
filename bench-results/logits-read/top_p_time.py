"""ms per `probabilities` call under top-p on real logits: the 0.5B q8's 16 rows after a
prompt (a verify's shape), one row and all 16, against the sort of the whole vocabulary that
top-p took before (old_top_p below, 38f9e05's rule), medians of 7 runs of 10 calls, 2 threads;
and whether both keep the same tokens."""
from pathlib import Path

import torch
from call_time import ms

from draftsman.models.loader import load_model
from draftsman.sampling import SamplingConfig, probabilities
from draftsman.store.resolve import resolve_gguf, resolve_model
from draftsman.testing.reference import reference_probabilities
from draftsman.text.tokenizer import Tokenizer

torch.set_num_threads(2)
NAME = "qwen2.5-coder-0.5b-instruct"
CONFIGS = (SamplingConfig(0.7, 0, 0.9), SamplingConfig(1.0, 0, 0.95), SamplingConfig(1.0, 40, 0.9))


def old_probabilities(logits, config):
    logits = logits.float() / config.temperature
    if config.top_k:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    above = sorted_probs.cumsum(-1) - sorted_probs
    drop_sorted = above >= config.top_p
    logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return logits.softmax(-1)


def real_logits() -> torch.Tensor:
    """The 0.5B q8's logits at the last 16 tokens of prompt.txt (prose and code spans)."""
    folder = resolve_model(NAME, pull=False)
    model = load_model(folder, "q8", gguf=resolve_gguf(NAME, pull=False))
    text = Path(__file__).with_name("prompt.txt").read_text()
    ids = Tokenizer.from_folder(folder).backend.encode(text).ids
    cache = model.new_cache(len(ids))
    logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], cache).logits[0, -16:]
    print(f"{len(ids)} prompt tokens; the last 16 rows' logits, top probability "
          f"{logits.float().softmax(-1).max(-1).values.median():.2f} (median)")
    return logits


def main() -> None:
    logits = real_logits()
    print("| config | rows | before (full sort) ms | now ms | same kept tokens |")
    print("|---|---|---|---|---|")
    for config in CONFIGS:
        for rows in (1, 16):
            x = logits[:rows]
            same = torch.equal(old_probabilities(x, config) > 0, probabilities(x, config) > 0)
            before = ms(lambda x=x, c=config: old_probabilities(x, c), 10)
            now = ms(lambda x=x, c=config: probabilities(x, c), 10)
            print(f"| T {config.temperature}, top-k {config.top_k}, top-p {config.top_p} | {rows} "
                  f"| {before:.2f} | {now:.2f} | {same} |")

    # where the two keep different tokens, against the float64 reference (ties lower id first)
    print("\n| config | row | kept before / now / reference | now = reference "
          "| before = reference |")
    print("|---|---|---|---|---|")
    for config in CONFIGS:
        before, now = old_probabilities(logits, config) > 0, probabilities(logits, config) > 0
        for r in range(logits.shape[0]):
            if torch.equal(before[r], now[r]):
                continue
            ref = torch.from_numpy(reference_probabilities(
                logits[r].double().numpy(), config.temperature, config.top_k, config.top_p) > 0)
            print(f"| T {config.temperature}, top-k {config.top_k}, top-p {config.top_p} | {r} "
                  f"| {int(before[r].sum())} / {int(now[r].sum())} / {int(ref.sum())} "
                  f"| {torch.equal(now[r], ref)} | {torch.equal(before[r], ref)} |")


if __name__ == "__main__":
    main()
