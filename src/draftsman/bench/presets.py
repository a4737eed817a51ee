"""Named benchmark setups for `draftsman bench --preset NAME`.

Explicit command-line options override a preset's values.
"""

from __future__ import annotations

from dataclasses import dataclass

# Copy-heavy sets (the answer repeats much of the prompt) and free generation; mt-bench
# is both: its second turns revise the first answer.
COPY_HEAVY_SETS = ("code-edit", "rag-qa", "grammar", "news-summarization")
FREE_SETS = ("humaneval", "mt-bench")


@dataclass(frozen=True)
class Preset:
    description: str
    methods: tuple[str, ...]
    datasets: tuple[str, ...]
    limit: int
    max_new_tokens: int
    repeats: int = 1
    peers: tuple[str, ...] = ()
    backend: str = "torch"
    turns: str = "first"
    numerics: str = "fast"


PRESETS: dict[str, Preset] = {
    "demo": Preset(
        "a few HumanEval and MT-Bench prompts on the default target: what `draftsman "
        "generate` runs by default (--backend auto, --method default) vs autoregressive, "
        "llama.cpp's own plain loop and transformers; a few minutes",
        methods=("default",),
        datasets=("humaneval", "mt-bench"),
        limit=2,
        max_new_tokens=48,
        peers=("llama.cpp:plain", "hf:plain"),
        backend="auto",
    ),
    "speculative": Preset(
        "the speculative family's table: each drafter, fixed γ 1-7, every adaptive "
        "controller and staged, on HumanEval and MT-Bench (first 20 each), with transformers; "
        "hours on a 2-core CPU",
        methods=(
            "speculative:gamma=1|2|3|4|5|7",
            "speculative:draft=ngram,gamma=1|2|3|4|5|7",
            "speculative:draft=prompt-lookup,gamma=1|2|3|4|5|7",
            "speculative:gamma=auto,gamma_policy=heuristic|acceptance|cost",
            "staged:subdraft=ngram,gamma=4",
        ),
        datasets=("humaneval", "mt-bench"),
        limit=20,
        max_new_tokens=128,
        peers=("hf",),
    ),
    "llama-cpp": Preset(
        "the llama.cpp backend on the default pair's GGUF weights: autoregressive, "
        "every drafter under the cost-model controller, prompt lookup with cost-chosen tree "
        "branches, the 0.5B draft at fixed γ, against "
        "llama.cpp's own plain and speculative decoding; HumanEval and MT-Bench, greedy",
        methods=(
            "speculative:draft=prompt-lookup,gamma=auto",
            "speculative:draft=ngram,gamma=auto",
            "speculative:draft=prompt-lookup,gamma=auto",
            "speculative:gamma=auto",
            "speculative:gamma=3",
        ),
        datasets=("humaneval", "mt-bench"),
        limit=5,
        max_new_tokens=128,
        peers=("llama.cpp",),
        backend="llama.cpp",
    ),
    "cpu": Preset(
        "llama.cpp backend, fast numerics, greedy, 128 new tokens, all turns: the "
        "configuration users get (default), prompt lookup and the 0.5B draft under the cost "
        "model against llama.cpp's own plain, lookup and speculative (0.5B) "
        "decoding, on the copy-heavy sets (code-edit, rag-qa, grammar, news-summarization, "
        "MT-Bench turn 2) and free generation (HumanEval, MT-Bench turn 1); first 2 prompts "
        "each: 14 prompt turns x 7 contestants, about half an hour on a 2-core CPU",
        methods=(
            "default",
            "speculative:draft=prompt-lookup,gamma=auto",
            "speculative:gamma=auto",
        ),
        datasets=(*COPY_HEAVY_SETS, *FREE_SETS),
        limit=2,
        max_new_tokens=128,
        peers=("llama.cpp:plain,lookup,speculative",),
        backend="llama.cpp",
        turns="all",
        numerics="fast",
    ),
}
