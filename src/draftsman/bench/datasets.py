"""Benchmark datasets by name: the registry over every dataset draftsman evaluates on.

Local datasets (HumanEval, MT-Bench, ShareGPT, three Reuters news formats) are read by the
loaders in `dataset_loaders`, the copy-heavy workloads built from them (code edits, RAG QA,
grammar rewrites) by `copy_workloads`; any `.jsonl` file with a `prompt` field also loads.
The original benchmark sets (CNN/DailyMail, XSum, SQuAD, WMT14, GSM8K, Alpaca) load through
the Hugging Face `datasets` library when it is installed and the hub answers.

Invariants:
- `load_dataset` returns prompts in a fixed order (file order; news by collection, then file
  name), so `limit=n` is the first n of the full list and repeated calls give equal lists.
- `Prompt.text` is the first user message, never chat-templated (the engine does that).
- `Prompt.turns`, when not empty, holds every user turn and `turns[0] == text`.
- Prompt ids are unique within a dataset.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from draftsman.bench import data_sources
from draftsman.bench.copy_workloads import code_edit, grammar, rag_qa
from draftsman.bench.dataset_loaders import (
    QA_FORMAT,
    SUMMARIZATION_FORMAT,
    TRANSLATION_FORMAT,
    Prompt,
    check_limit,
    humaneval,
    iter_json_array,
    load_jsonl,
    mt_bench,
    news_qa,
    news_summarization,
    news_translation,
    sharegpt,
    sharegpt_conversations,
)
from draftsman.errors import DraftsmanError, InvalidArgumentError, OfflineError

__all__ = [
    "Prompt",
    "workload",
    "DatasetInfo",
    "load_dataset",
    "list_datasets",
    "fetch_all",
    "sharegpt_conversations",
    "iter_json_array",
    "SUMMARIZATION_FORMAT",
    "TRANSLATION_FORMAT",
    "QA_FORMAT",
]


class DatasetInfo(NamedTuple):
    name: str
    description: str
    records: int  # prompts `load_dataset(name)` returns (hub sets: size of the default split)


# ----------------------------------------------------------------------------- helpers


def _key(name: str) -> str:
    """Dataset names match case-insensitively, with '_' and '-' interchangeable."""
    return name.strip().lower().replace("_", "-")


def _take(items: Iterator[Prompt], limit: int | None) -> list[Prompt]:
    out: list[Prompt] = []
    if limit == 0:
        return out
    for item in items:
        out.append(item)
        if limit is not None and len(out) >= limit:
            break
    return out


# ----------------------------------------------------------------------------- hub datasets


@dataclass(frozen=True)
class _HubSet:
    repo: str
    config: str | None
    split: str
    task: str
    records: int  # size of the default split
    description: str
    convert: Callable[[dict[str, Any]], tuple[str, str | None, dict[str, Any]]]


def _hub_cnn(r: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    return SUMMARIZATION_FORMAT.format(context=r["article"]), r["highlights"], {"id": r.get("id")}


def _hub_xsum(r: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    return SUMMARIZATION_FORMAT.format(context=r["document"]), r["summary"], {"id": r.get("id")}


def _hub_squad(r: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    answers = list(r["answers"]["text"])
    text = QA_FORMAT.format(context=r["context"], question=r["question"])
    return text, (answers[0] if answers else None), {"id": r.get("id"), "answers": answers}


def _hub_wmt(r: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    pair = r["translation"]
    return TRANSLATION_FORMAT.format(source_sentence=pair["en"]), pair["fr"], {}


def _hub_gsm8k(r: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    final = r["answer"].rsplit("####", 1)[-1].strip()
    return r["question"], r["answer"], {"final_answer": final}


def _hub_alpaca(r: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    text = r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else "")
    return text, r["output"] or None, {}


_HUB: dict[str, _HubSet] = {
    "cnn_dailymail": _HubSet(
        "abisee/cnn_dailymail", "3.0.0", "test", "summarization", 11490,
        "CNN/DailyMail 3.0.0 test, pipelined-decoding paper summarization prompt (hub)", _hub_cnn,
    ),
    "xsum": _HubSet(
        "EdinburghNLP/xsum", None, "test", "summarization", 11334,
        "XSum test, pipelined-decoding paper summarization prompt (hub)", _hub_xsum,
    ),
    "squad": _HubSet(
        "rajpurkar/squad", None, "validation", "qa", 10570,
        "SQuAD 1.1 validation, pipelined-decoding paper QA prompt (hub)", _hub_squad,
    ),
    "wmt14-en-fr": _HubSet(
        "wmt/wmt14", "fr-en", "test", "translation", 3003,
        "WMT14 EN->FR test, pipelined-decoding paper translation prompt (hub)", _hub_wmt,
    ),
    "gsm8k": _HubSet(
        "openai/gsm8k", "main", "test", "math", 1319,
        "GSM8K test, grade-school math word problems (hub)", _hub_gsm8k,
    ),
    "alpaca": _HubSet(
        "tatsu-lab/alpaca", None, "train", "instruction", 52002,
        "Stanford Alpaca instructions, train split (hub)", _hub_alpaca,
    ),
}  # fmt: skip


def _local_names() -> str:
    return ", ".join(_LOCAL) + ", or a path to a .jsonl file with a 'prompt' field"


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hub_unreachable_reason() -> str | None:
    """None if the hub answers an HTTP request within the timeout, else why not."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"offline mode is set ({var})"
    timeout = float(os.environ.get("DRAFTSMAN_HUB_TIMEOUT", "5"))
    request = urllib.request.Request(_hub_endpoint(), method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        return str(getattr(e, "reason", None) or e)


def _load_hub(name: str, spec: _HubSet, split: str | None, limit: int | None) -> list[Prompt]:
    try:
        import datasets as hf_datasets  # type: ignore[import-not-found]
    except ImportError:
        raise OfflineError(
            f"dataset '{name}' needs the Hugging Face hub, but the `datasets` package is not "
            f"installed (pip install datasets); local datasets: {_local_names()}"
        ) from None
    reason = _hub_unreachable_reason()
    if reason is not None:
        raise OfflineError(
            f"dataset hub unreachable ({_hub_endpoint()}: {reason}), cannot load '{name}'; "
            f"local datasets: {_local_names()}"
        )
    split = split or spec.split
    try:
        ds = hf_datasets.load_dataset(spec.repo, spec.config, split=split)
    except (ConnectionError, TimeoutError) as e:
        raise OfflineError(f"dataset hub unreachable while loading '{name}': {e}") from e
    except Exception as e:  # the library raises many kinds; the user needs one line
        msg = " ".join(str(e).split())
        raise DraftsmanError(f"cannot load '{name}' ({spec.repo}, split {split}): {msg}") from e
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    prompts = []
    for i, rec in enumerate(ds):
        text, reference, meta = spec.convert(rec)
        prompts.append(
            Prompt(
                id=f"{name}/{split}/{i}",
                dataset=name,
                task=spec.task,
                text=text,
                reference=reference,
                metadata={**meta, "repo": spec.repo, "split": split, "index": i},
            )
        )
    return prompts


# ----------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class _LocalSet:
    load: Callable[[], Iterator[Prompt]]
    split: str
    records: int
    description: str


_LOCAL: dict[str, _LocalSet] = {
    "humaneval": _LocalSet(
        humaneval, "test", 164, "HumanEval code completion; tests in metadata for pass@1"
    ),
    "mt-bench": _LocalSet(mt_bench, "test", 80, "MT-Bench, 80 two-turn questions, 8 categories"),
    "sharegpt": _LocalSet(
        sharegpt, "train", 17_384, "ShareGPT V3 chats: first user turn, answer as reference"
    ),
    "news-summarization": _LocalSet(
        news_summarization, "test", 70,
        "Reuters-21578 news, pipelined-decoding paper summarization prompt; ref = headline",
    ),
    "news-translation": _LocalSet(
        news_translation, "test", 70,
        "Reuters-21578 leads, pipelined-decoding paper EN->FR translation prompt; no ref",
    ),
    "news-qa": _LocalSet(
        news_qa, "test", 70, "Reuters-21578 news, pipelined-decoding paper QA prompt; no reference"
    ),
    "code-edit": _LocalSet(
        code_edit, "test", 164,
        "HumanEval programs with one edit (planted bug, type hints, docstring, rename, port); "
        "answer = the whole changed function",
    ),
    "rag-qa": _LocalSet(
        rag_qa, "test", 70,
        "Reuters-21578 article pasted as a document; answer by quoting it; no reference",
    ),
    "grammar": _LocalSet(
        grammar, "test", 70,
        "Reuters-21578 opening paragraphs with 3 planted grammar errors; ref = the original",
    ),
}  # fmt: skip


def load_dataset(
    name: str | os.PathLike[str], *, limit: int | None = None, split: str | None = None
) -> list[Prompt]:
    """Prompts of dataset `name` (see `list_datasets`) or of a local `.jsonl` file.

    `limit` keeps the first n prompts. `split` defaults to the dataset's only / usual split;
    a local dataset rejects any other. Fetches the local sources on first use."""
    check_limit(limit)
    raw = os.fspath(name)
    key = _key(raw)
    if key in _LOCAL:
        spec = _LOCAL[key]
        if split is not None and split != spec.split:
            raise InvalidArgumentError(
                f"dataset '{key}' has only the split '{spec.split}', not '{split}'"
            )
        return _take(spec.load(), limit)
    hub = {_key(k): k for k in _HUB}
    if key in hub:
        return _load_hub(hub[key], _HUB[hub[key]], split, limit)
    path = Path(raw).expanduser()
    if raw.endswith(".jsonl") or os.sep in raw or "/" in raw or path.is_file():
        if split is not None:
            raise InvalidArgumentError("a .jsonl dataset has no splits; drop --split")
        return load_jsonl(path, limit)
    raise InvalidArgumentError(
        f"unknown dataset '{raw}'; local: {_local_names()}; hub: {', '.join(_HUB)}"
    )


# Where the answer repeats much of the prompt, so that guessing from it pays; later turns of
# a conversation revise an earlier answer and count too.
COPY_HEAVY = frozenset({"code-edit", "rag-qa", "grammar", "news-summarization", "news-qa",
                        "cnn_dailymail", "xsum", "squad"})
FREE_GENERATION = frozenset({"humaneval", "mt-bench", "sharegpt", "alpaca", "gsm8k"})


def workload(dataset: str, turn: int = 1) -> str:
    """"copy-heavy", "free generation" or "other" for a dataset's turn (1-based)."""
    key = _key(dataset)
    if key in {_key(n) for n in COPY_HEAVY} or (turn > 1 and key in FREE_GENERATION):
        return "copy-heavy"
    return "free generation" if key in FREE_GENERATION else "other"


def list_datasets() -> list[DatasetInfo]:
    """(name, description, records) of every named dataset: local ones first, then hub ones."""
    local = [DatasetInfo(n, s.description, s.records) for n, s in _LOCAL.items()]
    hub = [DatasetInfo(n, s.description, s.records) for n, s in _HUB.items()]
    return local + hub


def fetch_all(*, force: bool = False) -> dict[str, Path]:
    """Download every local source once (hash-checked); returns source name -> local path."""
    return data_sources.fetch_all(force=force)
