"""The n-gram and prompt-lookup drafters index incrementally and propose exactly what the
straightforward full-rescan algorithms propose, through growth, rollback and new requests."""

from __future__ import annotations

import random

import pytest

from draftsman.proposers.ngram import NGramProposer
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.proposers.sequence_index import common_prefix
from draftsman.sampling import Sampler, SamplingConfig


def reference_lookup(seq: list[int], gamma: int, max_n: int, min_n: int) -> list[list[int]]:
    """Every match, in order: longest suffix first, then the latest earlier occurrence."""
    out, end = [], len(seq)
    for n in range(min(max_n, end - 1), min_n - 1, -1):
        for i in range(end - n - 1, -1, -1):
            if seq[i : i + n] == seq[end - n :] and seq[i + n : i + n + gamma]:
                out.append(seq[i + n : i + n + gamma])
    return out


def reference_table(seq: list[int], order: int) -> dict:
    table: dict = {}
    for t in range(1, len(seq)):
        for k in range(1, min(order - 1, t) + 1):
            count, _ = table.setdefault(tuple(seq[t - k : t]), {}).get(seq[t], (0, 0))
            table[tuple(seq[t - k : t])][seq[t]] = (count + 1, t)
    return table


def reference_next(table: dict, seq: list[int], order: int) -> tuple[int, int] | None:
    for k in range(min(order - 1, len(seq)), 0, -1):
        slot = table.get(tuple(seq[-k:]))
        if slot:
            return max(slot.items(), key=lambda item: item[1])[0], k
    return None


def reference_ngram(seq: list[int], gamma: int, branches: int, order: int) -> list[list[int]]:
    table = reference_table(seq, order)

    def cont(tail: list[int], n: int) -> list[int]:
        guess: list[int] = []
        for _ in range(n):
            found = reference_next(table, tail + guess, order)
            if found is None:
                break
            guess.append(found[0])
        return guess

    for k in range(min(order - 1, len(seq)), 0, -1):
        slot = table.get(tuple(seq[-k:]))
        if slot:
            ranked = sorted(slot.items(), key=lambda item: item[1], reverse=True)
            return [[t] + cont(seq[-order:] + [t], gamma - 1) for t, _ in ranked[:branches]]
    return []


def sequences(rng: random.Random, steps: int):
    """A sequence that grows, is cut back (rollback), or is replaced (new request)."""
    seq = [rng.randrange(6) for _ in range(rng.randint(0, 10))]
    for _ in range(steps):
        r = rng.random()
        if r < 0.2 and seq:
            seq = seq[: rng.randrange(len(seq))] + [rng.randrange(6)
                                                    for _ in range(rng.randint(0, 4))]
            yield seq, False
        elif r < 0.25:
            seq = [rng.randrange(6) for _ in range(rng.randint(0, 10))]
            yield seq, True
        else:
            seq = seq + [rng.randrange(6) for _ in range(rng.randint(1, 4))]
            yield seq, False


SAMPLER = Sampler(SamplingConfig())


@pytest.mark.parametrize("max_n,min_n", [(3, 1), (2, 2), (4, 2)])
def test_prompt_lookup_matches_full_rescan(max_n, min_n):
    rng = random.Random(max_n * 10 + min_n)
    lookup = PromptLookupProposer(max_n, min_n)
    for seq, new_request in sequences(rng, 600):
        if new_request and rng.random() < 0.5:
            lookup.start(seq, 0)
        gamma, branches = rng.randint(0, 5), rng.randint(1, 4)
        expected = reference_lookup(seq, gamma, max_n, min_n)
        assert lookup.propose(seq, gamma, SAMPLER).tokens == (expected[0] if expected else [])
        firsts, want = set(), []
        for guess in expected:
            if guess[0] not in firsts and len(want) < branches:
                firsts.add(guess[0])
                want.append(guess)
        got = lookup.propose_branches(seq, gamma, branches, SAMPLER)
        assert [p.tokens for p in got] == want


@pytest.mark.parametrize("order", [2, 3, 4])
def test_ngram_matches_full_rebuild(order):
    rng = random.Random(order)
    ngram = NGramProposer(order)
    for seq, new_request in sequences(rng, 600):
        if new_request and rng.random() < 0.5:
            ngram.start(seq, 0)
        gamma, branches = rng.randint(0, 5), rng.randint(1, 4)
        expected = reference_ngram(seq, gamma, 1, order) if gamma > 0 else []
        assert ngram.propose(seq, gamma, SAMPLER).tokens == (expected[0] if expected else [])
        want = reference_ngram(seq, gamma, branches, order) if gamma > 0 else []
        assert [p.tokens for p in ngram.propose_branches(seq, gamma, branches, SAMPLER)] == want


def test_common_prefix():
    rng = random.Random(0)
    for _ in range(500):
        a = [rng.randrange(3) for _ in range(rng.randint(0, 12))]
        b = a[: rng.randint(0, len(a))] + [rng.randrange(3) for _ in range(rng.randint(0, 5))]
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n
