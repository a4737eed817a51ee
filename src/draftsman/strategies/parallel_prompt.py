"""Parallel prompt decoding (Chen et al., "Hardware-Aware Parallel Prompt Decoding").

No draft model: m trained prompt-token embeddings follow the last accepted token, and the
target guesses the next m tokens from them in the same forward that verifies the previous
guesses. Each step is one target forward over

    [root = last committed token] + candidate tree (ranked guesses) + prompt tokens on nodes

with tree attention (tree.py). The accepted path is committed with `cache.keep`, the
target's token after it becomes the next root, and the prompt tokens of the last accepted
node supply the next guesses. The tree depends on the *state* k (prompt tokens carried by
the last accepted node = guesses available): the dynamic sparse tree of section 4
(sparse_tree.py) holds one tree per state, sized for this machine (τ(n) / L_fp(n)).

Exactness: greedy matching commits exactly the autoregressive tokens (candidate rows never
see prompt rows). With temperature > 0 the paper's typical acceptance is used: lossy,
reported with its threshold in every Step's `extra`.

    τ = committed tokens / target forwards = 1 + E[accepted path length]
"""

from __future__ import annotations

from collections.abc import Iterator

from draftsman.models.base import DecoderLM
from draftsman.proposers.prompt_tokens import TreeDecoder, TypicalAcceptance
from draftsman.sampling import Sampler
from draftsman.strategies.base import Budget, GenerationConfig, Step, Strategy, Timer, check_fits


class ParallelPrompt(Strategy):
    name = "parallel-prompt"
    exactness = "exact-greedy"  # typical acceptance (temperature > 0) is lossy

    def __init__(self, decoder: TreeDecoder, typical: TypicalAcceptance | None = None,
                 info: dict | None = None) -> None:
        self.decoder = decoder
        self.target: DecoderLM = decoder.model
        self.typical = typical or TypicalAcceptance()
        self.info = dict(info or {})

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        model = self.target
        check_fits(model, len(prompt_ids), config)
        dec = self.decoder
        m, n = dec.prompts.count, dec.prompts.epts
        capacity = len(prompt_ids) + config.max_new_tokens + max(dec.max_rows, m * n) + 2
        cache = model.new_cache(capacity)
        sampler = Sampler(config.sampling)
        budget = Budget(config)
        timer = Timer()
        lossy = not sampler.greedy
        extra = dict(self.info)
        if lossy:
            extra.update(acceptance="typical", threshold=self.typical.threshold,
                         typical_alpha=self.typical.alpha, lossy=True)
        with timer("verify"):  # prefill: prompt + m prompt tokens -> first token + guesses
            res = dec.step(cache, list(prompt_ids), None, sampler, self.typical)
        tokens = budget.clip([res.next_token])
        yield Step(tokens, ["target"], target_forwards=1, prefill=True,
                   verify_seconds=timer.take()["verify"], finish=budget.finish,
                   extra={**extra, "state": res.state, "rows": res.rows})
        root, guesses = res.next_token, res.guesses
        while not budget.done:
            with timer("verify"):
                res = dec.step(cache, [root], guesses, sampler, self.typical)
            new = budget.clip(res.accepted + [res.next_token])
            kept = min(len(res.accepted), len(new))
            yield Step(
                new,
                ["prompt"] * kept + ["target"] * (len(new) - kept),
                drafted=res.drafted,
                accepted=len(res.accepted),
                rejected=res.rejected,
                target_forwards=1,
                verify_seconds=timer.take()["verify"],
                finish=budget.finish,
                extra={**extra, "state": res.state, "rows": res.rows},
            )
            root, guesses = res.next_token, res.guesses
