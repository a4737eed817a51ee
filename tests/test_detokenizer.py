"""The incremental detokeniser and the stop-aware text stream against full re-decoding.

Tiny tokenizers built here cover the three decode shapes that break "decode of a suffix ==
suffix of the decode": byte-level BPE (multi-byte characters split across tokens), Metaspace
(the first token's leading space dropped) and word-level (tokens joined with spaces). The
real Qwen and SmolLM tokenizers are checked too (marked `real`).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from draftsman.text.detokenizer import Detokenizer
from draftsman.text.stops import StopMatcher
from draftsman.text.stream import TextStream

TEXT = ("def quicksort(xs):\n    return sorted(xs)  # 快速排序 🚀🚀 naïve café — "
        "héllo wörld 你好，世界！ こんにちは 🤖👩‍💻 ∑∫√ 12345 the quick brown fox. ") * 4

Decode = Callable[[list[int]], str]


def byte_level() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def metaspace() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=200,
                                                        special_tokens=["<unk>", "<s>"]))
    return tok


def word_level() -> Tokenizer:
    words = sorted(set(TEXT.split()))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<s>", *words])},
                                     unk_token="<s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>"])
    return tok


def decoder_of(tok: Tokenizer) -> Decode:
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


TINY = {"byte-level": byte_level, "metaspace": metaspace, "word-level": word_level}


def random_steps(rng: random.Random, vocab: int, n: int, real_ids: list[int]) -> list[list[int]]:
    """Steps of 1-5 tokens: random ids (invalid UTF-8 included) or runs of real text."""
    ids: list[int] = []
    while len(ids) < n:
        if rng.random() < 0.5:
            start = rng.randrange(len(real_ids))
            ids += real_ids[start:start + rng.randint(1, 8)]
        else:
            ids.append(rng.randrange(vocab))
    steps, i = [], 0
    while i < len(ids):
        k = rng.randint(1, 5)
        steps.append(ids[i:i + k])
        i += k
    return steps


def check_detokenizer(decode: Decode, steps: list[list[int]]) -> None:
    detok, final, ids = Detokenizer(decode), "", []
    for step in steps:
        ids += step
        tail = detok.push(step)
        assert final + tail == decode(ids)
        final += tail[:len(tail) - len(detok.pending)]
        assert final + detok.pending == decode(ids)
        assert len(final) == detok.final_length


def reference_events(decode: Decode, steps: list[tuple[list[int], str | None]],
                     stops: StopMatcher) -> list[tuple[list[int], str, str | None]]:
    """The engine's stream before the incremental detokeniser: re-decode everything."""
    ids: list[int] = []
    sent, out = 0, []
    for tokens, finish in steps:
        ids.extend(tokens)
        text = decode(ids)
        kept = list(tokens)
        cut = stops.find(text)
        if cut is not None:
            n = len(ids) - len(tokens)
            while n < len(ids) and stops.find(decode(ids[: n + 1])) is None:
                n += 1
            kept = tokens[: n + 1 - (len(ids) - len(tokens))]
            text, finish = text[:cut], "stop"
            safe = len(text)
        elif finish is not None:
            safe = len(text)
        else:
            safe = stops.safe_length(text.rstrip("\ufffd"))
        delta, sent = text[sent:safe], max(sent, safe)
        out.append((kept, delta, finish))
        if finish is not None:
            break
    return out


def stream_events(decode: Decode, steps: list[tuple[list[int], str | None]],
                  stops: StopMatcher) -> list[tuple[list[int], str, str | None]]:
    stream, out = TextStream(decode, stops), []
    for tokens, finish in steps:
        d = stream.push(tokens, finish)
        out.append((d.tokens, d.text, d.finish))
        if d.finish is not None:
            break
    return out


def random_stops(rng: random.Random, text: str) -> tuple[str, ...]:
    """Substrings of the text the steps spell (so they do occur), and some that may not."""
    picks = []
    for _ in range(rng.randint(0, 3)):
        i = rng.randrange(max(len(text), 1))
        picks.append(text[i:i + rng.randint(1, 6)])
    if rng.random() < 0.3:
        picks.append(rng.choice(["zzz", "\n\n", "🚀", "界！"]))
    return tuple(picks)


def check_stream(decode: Decode, vocab: int, real_ids: list[int], seed: int) -> None:
    rng = random.Random(seed)
    steps = random_steps(rng, vocab, rng.randint(1, 60), real_ids)
    marked = [(s, None) for s in steps]
    if rng.random() < 0.5:
        marked[-1] = (steps[-1], "length")
    stops = StopMatcher(random_stops(rng, decode([t for s in steps for t in s])))
    assert stream_events(decode, marked, stops) == reference_events(decode, marked, stops)


@pytest.mark.parametrize("kind", sorted(TINY))
def test_detokenizer_matches_full_decode_tiny(kind):
    tok = TINY[kind]()
    real_ids = tok.encode(TEXT).ids
    rng = random.Random(0)
    for _ in range(200):
        steps = random_steps(rng, tok.get_vocab_size(), rng.randint(1, 80), real_ids)
        check_detokenizer(decoder_of(tok), steps)


@pytest.mark.parametrize("kind", sorted(TINY))
def test_stream_matches_full_redecode_tiny(kind):
    tok = TINY[kind]()
    real_ids = tok.encode(TEXT).ids
    for seed in range(300):
        check_stream(decoder_of(tok), tok.get_vocab_size(), real_ids, seed)


def test_multibyte_character_held_until_complete():
    tok = byte_level()
    ids = tok.encode("🚀").ids
    pieces = [[t] for t in ids]
    detok = Detokenizer(decoder_of(tok))
    for piece in pieces[:-1]:
        detok.push(piece)
        assert detok.final_length == 0
    assert detok.push(pieces[-1]) == "🚀" and detok.pending == ""


def test_stream_cuts_tokens_at_stop():
    tok = word_level()
    ids = tok.encode("the quick brown fox.").ids
    stream = TextStream(decoder_of(tok), StopMatcher(("brown",)))
    first = stream.push(ids[:1])
    last = stream.push(ids[1:])
    assert (first.text + last.text, last.tokens, last.finish) == ("the quick ", ids[1:3],
                                                                  "stop")


REAL = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")


@pytest.mark.real
@pytest.mark.parametrize("name", REAL)
def test_detokenizer_and_stream_on_real_tokenizers(name):
    from draftsman.store.resolve import ensure_model
    from draftsman.text.tokenizer import Tokenizer as DraftsmanTokenizer

    tok = DraftsmanTokenizer.from_folder(ensure_model(name))
    vocab = tok.backend.get_vocab_size(with_added_tokens=True)
    real_ids = tok.encode(TEXT, special=False)
    rng = random.Random(1)
    for _ in range(300):
        check_detokenizer(tok.decode, random_steps(rng, vocab, rng.randint(1, 120), real_ids))
    for seed in range(300):
        check_stream(tok.decode, vocab, real_ids, seed)
