"""Benchmark prompt sources, one loader per dataset family, and the `Prompt` they yield.

Local families read real public files fetched once and hash-pinned (see `data_sources`):
HumanEval, MT-Bench, ShareGPT and 70 Reuters-21578 news articles, the latter formatted three
ways with the prompt formats of Table 1 of "Predictive Pipelined Decoding" (summarization,
EN->FR translation, question answering). `load_jsonl` reads any `.jsonl` file with a `prompt`
field. `datasets` names these loaders and is what callers use.

Invariants: every loader yields prompts in a fixed order (file order; news by collection,
then file name); `Prompt.text` is the first user message, never chat-templated;
`Prompt.turns`, when not empty, holds every user turn and `turns[0] == text`; prompt ids are
unique within a dataset.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from draftsman.bench import data_sources
from draftsman.errors import DraftsmanError, InvalidArgumentError


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. `reference` is a human-written answer when the dataset has one."""

    id: str
    dataset: str
    task: str
    text: str
    reference: str | None = None
    turns: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)


# ----------------------------------------------------------------------------- prompt formats
# Table 1 of Yang et al., "Predictive Pipelined Decoding", reproduced verbatim; "{context}",
# "{question}" and "{source_sentence}" are the fields filled in.

_RULE = "\u2014" * 7  # the seven em dashes framing the QA context

SUMMARIZATION_FORMAT = "# Article\n{context}\n# Summarize the article\n### Assistant:"

QA_FORMAT = (
    "We have provided context information below.\n"
    f"{_RULE}\n"
    "{context}\n"
    f"{_RULE}\n"
    "### Given this information, please answer the question: {question}\n"
    "### Assistant:"
)

TRANSLATION_FORMAT = (
    "### Instruction: Translate English sentence into French.\n"
    "English: Sounds like a typical rugby club to me.\n"
    "French: \u00c7a m\u2019a l\u2019air d\u2019\u00eatre un club de rugby typique. #\n"
    "English: At an English university, perhaps\u2026\n"
    "French: Dans une universit\u00e9 anglaise, peut-\u00eatre\u2026 #\n"
    "English: {source_sentence}\n"
    "French:"
)

HUMANEVAL_FORMAT = "Complete the following Python function:\n```python\n{prompt}```"


# ----------------------------------------------------------------------------- helpers

_SPACE = re.compile(r"\s*")
_DELIMITERS = frozenset(" \t\r\n,]")


def check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidArgumentError(f"limit must be a non-negative integer, got {limit!r}")


# ----------------------------------------------------------------------------- JSON streaming


def iter_json_array(
    path: str | os.PathLike[str],
    *,
    chunk_chars: int = 1 << 20,
    stats: dict[str, int] | None = None,
) -> Iterator[Any]:
    """Yield the elements of the top-level JSON array in `path`, one at a time.

    Reads `chunk_chars` characters at a time and decodes element by element with
    `json.JSONDecoder.raw_decode`, so memory stays near one chunk plus one element. A file cut
    off inside an element (ShareGPT's is) ends the iteration after the last complete element;
    when given, `stats` receives `records` and `truncated_chars` (length of the incomplete
    tail; 0 when the array is closed). Malformed JSON that is not a cut-off tail raises
    InvalidArgumentError.
    """
    decoder = json.JSONDecoder()
    records = 0

    def report(truncated: int) -> None:
        if stats is not None:
            stats.update(records=records, truncated_chars=truncated)

    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False

        def more() -> bool:
            """Drop the consumed text, append a chunk; False once the file is exhausted."""
            nonlocal buf, pos, eof
            chunk = f.read(chunk_chars)
            eof = not chunk
            buf, pos = buf[pos:] + chunk, 0
            return not eof

        def skip_space() -> bool:
            """Advance to the next non-space character; False if the file ends first."""
            nonlocal pos
            while True:
                pos = _SPACE.match(buf, pos).end()
                if pos < len(buf):
                    return True
                if not more():
                    return False

        if not skip_space() or buf[pos] != "[":
            raise InvalidArgumentError(f"{path}: expected a JSON array")
        pos += 1
        if not skip_space() or buf[pos] == "]":
            report(0)
            return
        while True:  # an element starts at `pos`
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as e:
                    cut_off = e.msg.startswith("Unterminated string") or e.pos + 16 >= len(buf)
                    if not cut_off:
                        raise InvalidArgumentError(
                            f"{path}: invalid JSON in element {records}: {e.msg}"
                        ) from None
                    if more():
                        continue
                    report(len(buf) - pos)  # the file ends inside this element
                    return
                number = isinstance(value, int | float) and not isinstance(value, bool)
                if number and (end == len(buf) or buf[end] not in _DELIMITERS):
                    if not eof:  # "678." may be "678.5e1" cut by the chunk
                        more()
                        continue
                    if end == len(buf):  # "2" at the very end may have been "25"
                        report(len(buf) - pos)
                        return
                break
            records += 1
            yield value
            pos = end
            if not skip_space():
                report(0)  # cut off right after an element
                return
            if buf[pos] == "]":
                report(0)
                return
            if buf[pos] != ",":
                raise InvalidArgumentError(f"{path}: expected ',' or ']' after element {records}")
            pos += 1
            if not skip_space():
                report(0)
                return
            if buf[pos] == "]":
                raise InvalidArgumentError(f"{path}: trailing ',' after element {records}")


# ----------------------------------------------------------------------------- HumanEval


def humaneval() -> Iterator[Prompt]:
    path = data_sources.ensure("humaneval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            code = rec["prompt"] if rec["prompt"].endswith("\n") else rec["prompt"] + "\n"
            yield Prompt(
                id=rec["task_id"],
                dataset="humaneval",
                task="code",
                text=HUMANEVAL_FORMAT.format(prompt=code),
                reference=rec["canonical_solution"],
                metadata={
                    "task_id": rec["task_id"],
                    "prompt": rec["prompt"],  # raw code prefix: completion = prompt + body
                    "entry_point": rec["entry_point"],
                    "test": rec["test"],  # defines check(candidate)
                },
            )


# ----------------------------------------------------------------------------- MT-Bench


def mt_bench() -> Iterator[Prompt]:
    path = data_sources.ensure("mt-bench")
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            turns = tuple(rec["turns"])
            references = rec.get("reference") or []
            meta: dict[str, Any] = {"question_id": rec["question_id"], "category": rec["category"]}
            if references:
                meta["references"] = list(references)  # one per turn
            yield Prompt(
                id=f"mt-bench/{rec['question_id']}",
                dataset="mt-bench",
                task="chat",
                text=turns[0],
                reference=references[0] if references else None,
                turns=turns,
                metadata=meta,
            )


# ----------------------------------------------------------------------------- ShareGPT

_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def _sharegpt_records() -> Iterator[tuple[int, str, list[dict[str, str]]]]:
    path = data_sources.ensure("sharegpt")
    for index, rec in enumerate(iter_json_array(path)):
        messages = [
            {"role": _ROLES.get(m["from"].lower(), m["from"].lower()), "content": m["value"]}
            for m in rec["conversations"]
        ]
        yield index, rec["id"], messages


def sharegpt_conversations(limit: int | None = None) -> Iterator[list[dict[str, str]]]:
    """Every complete ShareGPT record, in file order, as `[{"role", "content"}, ...]` with
    roles `user`, `assistant` or `system` (17,671 records; 126 of them are empty lists and
    some start with an assistant turn, because the upstream split cut long chats)."""
    check_limit(limit)
    for n, (_, _, messages) in enumerate(_sharegpt_records()):
        if limit is not None and n >= limit:
            return
        yield messages


def sharegpt() -> Iterator[Prompt]:
    """One prompt per record that has a non-empty user turn: text = the first user turn,
    reference = the assistant message right after it (None when there is none)."""
    for index, source_id, messages in _sharegpt_records():
        first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if first is None or not messages[first]["content"].strip():
            continue
        nxt = messages[first + 1] if first + 1 < len(messages) else None
        yield Prompt(
            id=f"sharegpt/{index}",
            dataset="sharegpt",
            task="chat",
            text=messages[first]["content"],
            reference=nxt["content"] if nxt and nxt["role"] == "assistant" else None,
            turns=tuple(m["content"] for m in messages if m["role"] == "user"),
            metadata={"source_id": source_id, "record": index, "messages": len(messages)},
        )


# ----------------------------------------------------------------------------- news (Reuters)

_NEWS_COLLECTIONS = ("crude", "acq")  # the order prompts come in
_SIGNOFF = re.compile(r"\s*\bREUTER\b[\s.]*$", re.IGNORECASE)
_PARAGRAPH = re.compile(r"\n[ \t]{2,}|\n[ \t]*\n")  # Reuters indents each new paragraph
_SAID = re.compile(r"^(?P<who>[^,;]{2,80}?) said\b")
_HEADLINE_NOTE = (
    "the Reuters headline: the closest human-written summary available, not a written abstract"
)


@dataclass(frozen=True)
class NewsArticle:
    collection: str
    file: str
    newid: str
    date: str
    title: str
    paragraphs: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.collection}/{Path(self.file).stem}"

    @property
    def body(self) -> str:
        return "\n".join(self.paragraphs)

    @property
    def lead(self) -> str:
        """The first paragraph: a Reuters lead is one or two sentences."""
        return self.paragraphs[0]

    def meta(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "file": self.file,
            "newid": self.newid,
            "date": self.date,
            "title": self.title,
        }


def news_articles() -> list[NewsArticle]:
    root = data_sources.ensure("reuters")
    out = []
    for collection in _NEWS_COLLECTIONS:
        for path in sorted((root / collection).glob("*.xml")):
            doc = ElementTree.parse(path).getroot()
            text = doc.find("TEXT")
            if text is None:
                raise DraftsmanError(f"{path}: no <TEXT> element")
            title = " ".join((text.findtext("TITLE") or "").split())
            body = _SIGNOFF.sub("", text.findtext("BODY") or "")
            paragraphs = tuple(
                p for p in (" ".join(part.split()) for part in _PARAGRAPH.split(body)) if p
            )
            if not title or not paragraphs:
                raise DraftsmanError(f"{path}: missing <TITLE> or <BODY>")
            out.append(
                NewsArticle(
                    collection=collection,
                    file=f"{collection}/{path.name}",
                    newid=doc.get("NEWID", ""),
                    date=(doc.findtext("DATE") or "").strip(),
                    title=title,
                    paragraphs=paragraphs,
                )
            )
    return out


def news_question(article: NewsArticle) -> tuple[str, str]:
    """(question, kind) for the QA prompt, built from the lead: "X said ..." asks what X said;
    otherwise a question about the article's main event."""
    m = _SAID.match(article.lead)
    if m and len(m["who"].split()) <= 10:
        who = m["who"].replace("<", "").replace(">", "").strip("() ")
        if re.match(r"(A|An|The) [a-z]", who):
            who = who[0].lower() + who[1:]
        return f"What did {who} say, according to the article?", "lead-speaker"
    return "What is the main event reported in the article, and who reported it?", "main-event"


def news_summarization() -> Iterator[Prompt]:
    for a in news_articles():
        yield Prompt(
            id=a.id,
            dataset="news-summarization",
            task="summarization",
            text=SUMMARIZATION_FORMAT.format(context=a.body),
            reference=a.title,
            metadata={**a.meta(), "context": a.body, "reference_kind": _HEADLINE_NOTE},
        )


def news_translation() -> Iterator[Prompt]:
    for a in news_articles():
        yield Prompt(
            id=a.id,
            dataset="news-translation",
            task="translation",
            text=TRANSLATION_FORMAT.format(source_sentence=a.lead),
            metadata={
                **a.meta(),
                "source_text": a.lead,
                "source_language": "en",
                "target_language": "fr",
                "reference_kind": "none: score against the target model's own output",
            },
        )


def news_qa() -> Iterator[Prompt]:
    for a in news_articles():
        question, kind = news_question(a)
        yield Prompt(
            id=a.id,
            dataset="news-qa",
            task="qa",
            text=QA_FORMAT.format(context=a.body, question=question),
            metadata={
                **a.meta(),
                "context": a.body,
                "question": question,
                "question_kind": kind,
                "reference_kind": "none: score against the target model's own output",
            },
        )


# ----------------------------------------------------------------------------- local JSONL


def load_jsonl(path: Path, limit: int | None) -> list[Prompt]:
    """Each non-blank line is an object with a string `prompt`; optional `id` (unique),
    `reference`, `task`, `turns` (list of strings); other fields go to metadata."""
    if not path.is_file():
        raise InvalidArgumentError(f"dataset file not found: {path}")
    dataset = path.name.removesuffix(".jsonl")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if limit is not None and len(prompts) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidArgumentError(f"{where}: invalid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise InvalidArgumentError(f"{where}: expected a JSON object")
            if "prompt" not in rec:
                raise InvalidArgumentError(f"{where}: missing required field 'prompt'")
            text = rec.pop("prompt")
            if not isinstance(text, str) or not text:
                raise InvalidArgumentError(f"{where}: 'prompt' must be a non-empty string")
            reference = rec.pop("reference", None)
            if reference is not None and not isinstance(reference, str):
                raise InvalidArgumentError(f"{where}: 'reference' must be a string or null")
            pid = str(rec.pop("id", lineno))
            if pid in seen:
                raise InvalidArgumentError(f"{where}: duplicate id '{pid}'")
            seen.add(pid)
            turns = rec.pop("turns", None) or ()
            if not (isinstance(turns, list | tuple) and all(isinstance(t, str) for t in turns)):
                raise InvalidArgumentError(f"{where}: 'turns' must be a list of strings")
            if turns and turns[0] != text:
                raise InvalidArgumentError(f"{where}: 'turns' must start with 'prompt'")
            prompts.append(
                Prompt(
                    id=pid,
                    dataset=dataset,
                    task=str(rec.pop("task", "custom")),
                    text=text,
                    reference=reference,
                    turns=tuple(turns),
                    metadata=rec,
                )
            )
    if not prompts and limit != 0:
        raise InvalidArgumentError(f"{path}: no prompts in file")
    return prompts
