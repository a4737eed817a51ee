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
    dtype: str | None = None  # None: the command line's --dtype (bf16 unless given)


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
        "llama.cpp's own plain, speculative and lookup decoding (lookup also at 10 tokens); "
        "HumanEval and MT-Bench, greedy",
        methods=(
            "speculative:draft=prompt-lookup,gamma=auto",
            "speculative:draft=ngram,gamma=auto",
            "speculative:draft=prompt-lookup,gamma=auto,branches=auto",
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
        "model, the torch backend on q4 (our K-quant kernels: plain, prompt lookup, suffix, "
        "suffix branches verified as one tree, the 0.5B draft, whole and with its head "
        "narrowed to 32,768 tokens, and the staged "
        "cascade suffix -> narrowed 0.5B whose long matches bypass the draft) and q8 (prompt "
        "lookup) in the same run, against llama.cpp's own plain, lookup (its default 3 "
        "tokens and 10) and speculative (0.5B) decoding, on the copy-heavy sets (code-edit, "
        "rag-qa, grammar, news-summarization, MT-Bench turn 2) and free generation "
        "(HumanEval, MT-Bench turn 1); first 2 prompts each: 14 prompt turns x 16 "
        "contestants, 17-57 minutes on a "
        "2-core CPU. Its records drive `--backend auto`",
        methods=(
            "default",
            "speculative:draft=prompt-lookup,gamma=auto",
            "speculative:gamma=auto",
            "autoregressive:engine=torch-q4",
            "speculative:draft=prompt-lookup,gamma=auto,engine=torch-q4|torch-q8",
            "speculative:draft=suffix,gamma=auto,engine=torch-q4",
            "speculative:draft=suffix,gamma=auto,branches=auto,engine=torch-q4",
            "speculative:gamma=auto,engine=torch-q4",
            "speculative:gamma=auto,draft_vocab=32768,engine=torch-q4",
            "staged:subdraft=suffix,gamma=auto,draft_vocab=32768,bypass=1,engine=torch-q4",
        ),
        datasets=(*COPY_HEAVY_SETS, *FREE_SETS),
        limit=2,
        max_new_tokens=128,
        peers=("llama.cpp:plain,lookup,lookup=10,speculative",),
        backend="llama.cpp",
        turns="all",
        numerics="fast",
    ),
    "torch-q4": Preset(
        "the torch backend on the 1.5B GGUF's own Q4_K/Q6_K blocks (--dtype q4), greedy, 128 "
        "new tokens, the first 3 HumanEval and 3 MT-Bench prompts: autoregressive, parallel "
        "prompt decoding (shipped prompt tokens; the tree size the q4 latency profile picks, "
        "and 4 rows), pipelined decoding with k = 1 (2 processes x 1 thread, shared head), "
        "BiLD with the target's first 14 or 21 of 28 layers as the small model, prompt lookup "
        "under the cost model, and llama.cpp's plain loop on the same GGUF; about 16 minutes "
        "on a 2-core CPU (run `draftsman profile --dtype q4` first on a quiet machine)",
        methods=(
            "parallel-prompt:tree_size=auto|4",
            # k = 1 on 2 cores: the main worker and its sub-worker get one core each. The
            # shared head: `train exit-head` trains on bf16, whose LM-head fingerprint a q4
            # model does not match, so a trained head would be refused here
            "pipelined:workers=1,threads=1,main_threads=1,exit_head=shared",
            # d/2, where the shared head's guesses rarely pass the fallback threshold, and
            # 3/4 depth, where the small model keeps most of its tokens
            "big-little:early_exit=14|21",
            "speculative:draft=prompt-lookup,gamma=auto",
        ),
        datasets=FREE_SETS,
        limit=3,
        max_new_tokens=128,
        peers=("llama.cpp:plain",),
        backend="torch",
        dtype="q4",
    ),
}
