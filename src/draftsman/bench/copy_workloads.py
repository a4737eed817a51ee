"""Copy-heavy benchmark workloads: prompts whose answer mostly repeats text the prompt holds.

These are the prompts a local user waits for: change a function and get it back whole,
answer from a pasted document by quoting it, fix the grammar of a paragraph.

- `code_edit`: every HumanEval problem's complete program (prompt + canonical solution) with
  one edit to make and an instruction to return the whole changed function. The edit kind
  rotates over the problems (problem i starts at kind i mod 5 and takes the first kind that
  applies): fix a planted bug, add type hints (the originals are stripped), add a docstring
  (the original is removed), rename the function (to camelCase), port to another style
  (loops <-> comprehensions). Planted changes are made on the source text, so the reference
  is the original program, unchanged, wherever one exists.
- `rag_qa`: a Reuters article pasted as a document, a question about it, and an instruction
  to quote the supporting sentences word for word before answering.
- `grammar`: the opening paragraphs of each Reuters article (at least 60 words) with three
  planted errors (subject-verb agreement, a homophone, a doubled word, a missing article);
  the reference is the original text.

Invariants: fixed order (HumanEval file order; news by collection, then file name), unique
ids, no randomness beyond CRC-32 of fixed strings, so every call returns equal lists; a
planted edit always changes the text and leaves Python that compiles.
"""

from __future__ import annotations

import ast
import gzip
import io
import json
import re
import tokenize
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from draftsman.bench import data_sources
from draftsman.bench.dataset_loaders import Prompt, news_articles, news_question
from draftsman.errors import DraftsmanError

EDIT_KINDS = ("fix-bug", "type-hints", "docstring", "rename", "port")
GRAMMAR_ERRORS = ("agreement", "homophone", "doubled-word", "missing-article")
GRAMMAR_MIN_WORDS = 60
GRAMMAR_ERRORS_PER_PROMPT = 3

RETURN_WHOLE = "Reply with the whole changed function in one ```python code block, nothing else."
RAG_FORMAT = (
    "Answer the question using only the document below. First quote, word for word and in "
    "quotation marks, the sentences of the document that support your answer; then give the "
    "answer in one sentence.\n\nDocument:\n{title}\n\n{body}\n\nQuestion: {question}"
)
GRAMMAR_FORMAT = (
    "Correct the grammar and spelling mistakes in the paragraph below. Change nothing else "
    "and reply with the corrected paragraph only.\n\n{text}"
)


@dataclass(frozen=True)
class Edit:
    kind: str
    instruction: str
    shown: str  # the program the prompt shows
    reference: str | None  # the expected program, when there is one
    entry_point: str  # the function's name after the edit
    detail: dict[str, Any]


# ----------------------------------------------------------------------------- source offsets


def _offsets(code: str) -> list[int]:
    """Character offset of the start of each line (1-based line numbers index it)."""
    starts, pos = [0, 0], 0
    for line in code.splitlines(keepends=True):
        pos += len(line)
        starts.append(pos)
    return starts


def _at(code: str, starts: list[int], line: int, col_bytes: int) -> int:
    """ast columns count UTF-8 bytes; this is the character offset."""
    text = code[starts[line]:starts[line + 1]]
    return starts[line] + len(text.encode("utf-8")[:col_bytes].decode("utf-8"))


def _function(code: str, name: str) -> ast.FunctionDef:
    for node in ast.parse(code).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise DraftsmanError(f"HumanEval program has no top-level function {name!r}")


def _compiles(code: str) -> bool:
    try:
        compile(code, "<edit>", "exec")
    except SyntaxError:
        return False
    return True


# ----------------------------------------------------------------------------- the edits

_NEGATE = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_ARITH = {"+": "-", "-": "+"}


def _plant_bug(code: str, body_start: int) -> tuple[str, dict[str, Any]] | None:
    """Negate the first comparison of the solution, else add one to its first integer, else
    swap its first + or -; None if the solution has none of them."""
    starts = _offsets(code)
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(code).readline)
              if starts[t.start[0]] + t.start[1] >= body_start]
    rules: list[tuple[str, Callable[[tokenize.TokenInfo], str | None]]] = [
        ("negated comparison", lambda t: _NEGATE.get(t.string) if t.type == tokenize.OP
         else None),
        ("off by one", lambda t: str(int(t.string) + 1) if t.type == tokenize.NUMBER
         and t.string.isdigit() else None),
        ("swapped operator", lambda t: _ARITH.get(t.string) if t.type == tokenize.OP
         else None),
    ]
    for what, rule in rules:
        for t in tokens:
            new = rule(t)
            if new is None:
                continue
            at = starts[t.start[0]] + t.start[1]
            planted = code[:at] + new + code[at + len(t.string):]
            if planted != code and _compiles(planted):
                return planted, {"bug": what, "line": t.start[0], "was": t.string, "now": new}
    return None


def _strip_hints(code: str, fn: ast.FunctionDef) -> str | None:
    starts = _offsets(code)
    cuts: list[tuple[int, int]] = []
    args = fn.args
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is None or a.annotation is None:
            continue
        name_end = _at(code, starts, a.lineno, a.col_offset) + len(a.arg)
        ann = a.annotation
        cuts.append((name_end, _at(code, starts, ann.end_lineno or ann.lineno,
                                   ann.end_col_offset or 0)))
    if fn.returns is not None:
        r = fn.returns
        arrow = code.rindex("->", 0, _at(code, starts, r.lineno, r.col_offset))
        while code[arrow - 1] == " ":
            arrow -= 1
        cuts.append((arrow, _at(code, starts, r.end_lineno or r.lineno, r.end_col_offset or 0)))
    if not cuts:
        return None
    for begin, end in sorted(cuts, reverse=True):
        code = code[:begin] + code[end:]
    return code


def _strip_docstring(code: str, fn: ast.FunctionDef) -> str | None:
    first = fn.body[0]
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
        and isinstance(first.value.value, str)
    if not is_doc or len(fn.body) < 2:
        return None
    lines = code.splitlines(keepends=True)
    return "".join(lines[:first.lineno - 1] + lines[first.end_lineno or first.lineno:])


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _edit(kind: str, program: str, body_start: int, entry: str) -> Edit | None:
    """The edit of `kind` on `program`, None when it does not apply to this problem."""
    fn = _function(program, entry)
    if kind == "fix-bug":
        bug = _plant_bug(program, body_start)
        if bug is None:
            return None
        return Edit(kind, f"The function `{entry}` below has a bug: it does not do what its "
                    "docstring says. Find and fix the bug, changing as little as possible.",
                    bug[0], program, entry, bug[1])
    if kind == "type-hints":
        shown = _strip_hints(program, fn)
        return None if shown is None else Edit(
            kind, f"Add type hints to the parameters and the return value of `{entry}` below.",
            shown, program, entry, {})
    if kind == "docstring":
        shown = _strip_docstring(program, fn)
        return None if shown is None else Edit(
            kind, f"Add a docstring to `{entry}` below that says what it does and gives an "
            "example.", shown, program, entry, {})
    if kind == "rename":
        new = _camel(entry)
        if new == entry or re.search(rf"\b{new}\b", program):
            return None
        renamed = re.sub(rf"\b{entry}\b", new, program)
        return Edit(kind, f"Rename the function `{entry}` below to `{new}` everywhere it "
                    "appears, the docstring's examples included.", program, renamed, new,
                    {"old_name": entry, "new_name": new})
    if kind == "port":
        nodes = list(ast.walk(fn))
        if any(isinstance(n, ast.For | ast.While) for n in nodes):
            style, text = "loops to comprehensions", "without explicit loops, using " \
                "comprehensions or built-in functions"
        elif any(isinstance(n, ast.comprehension) for n in nodes):
            style, text = "comprehensions to loops", "with explicit for loops instead of " \
                "comprehensions"
        else:
            return None
        return Edit(kind, f"Rewrite `{entry}` below {text}; keep its behaviour.", program,
                    None, entry, {"style": style})
    raise DraftsmanError(f"unknown edit kind {kind!r}")


def code_edit() -> Iterator[Prompt]:
    path = data_sources.ensure("humaneval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    for i, rec in enumerate(records):
        prompt, entry = rec["prompt"], rec["entry_point"]
        program = (prompt + rec["canonical_solution"]).strip("\n") + "\n"
        body_start = len(prompt.lstrip("\n"))
        order = EDIT_KINDS[i % len(EDIT_KINDS):] + EDIT_KINDS[:i % len(EDIT_KINDS)]
        edit = next((e for k in order if (e := _edit(k, program, body_start, entry))), None)
        if edit is None:
            raise DraftsmanError(f"{rec['task_id']}: no edit applies")
        yield Prompt(
            id=f"code-edit/{rec['task_id'].split('/')[-1]}",
            dataset="code-edit",
            task="code-edit",
            text=f"{edit.instruction} {RETURN_WHOLE}\n\n```python\n{edit.shown}```",
            reference=edit.reference,
            metadata={
                "task_id": rec["task_id"],
                "edit": edit.kind,
                **edit.detail,
                "original": program,
                "shown": edit.shown,
                # pass@1 runs the answer against HumanEval's tests under the edited name
                "prompt": prompt,
                "entry_point": edit.entry_point,
                "test": rec["test"],
            },
        )


# ----------------------------------------------------------------------------- RAG QA


def rag_qa() -> Iterator[Prompt]:
    for a in news_articles():
        question, kind = news_question(a)
        yield Prompt(
            id=f"rag-qa/{a.id}",
            dataset="rag-qa",
            task="qa",
            text=RAG_FORMAT.format(title=a.title, body=a.body, question=question),
            metadata={**a.meta(), "context": a.body, "question": question,
                      "question_kind": kind,
                      "reference_kind": "none: score against the target model's own output"},
        )


# ----------------------------------------------------------------------------- grammar

_WORD = re.compile(r"^(?P<pre>[^\w]*)(?P<core>[A-Za-z][A-Za-z']*)(?P<post>[^\w]*)$")
_AGREEMENT = {"is": "are", "are": "is", "was": "were", "were": "was", "has": "have",
              "have": "has"}
_HOMOPHONES = {"their": "there", "there": "their", "its": "it's", "it's": "its",
               "than": "then", "then": "than", "to": "too", "your": "you're",
               "whose": "who's", "affect": "effect", "effect": "affect"}
_ARTICLES = frozenset({"the", "a", "an"})


def _match_case(word: str, like: str) -> str:
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def _plant(kind: str, words: list[str], i: int) -> list[str] | None:
    """`words` with error `kind` at word i, None when the word does not allow it."""
    m = _WORD.match(words[i])
    if m is None:
        return None
    core, low = m["core"], m["core"].lower()
    table = {"agreement": _AGREEMENT, "homophone": _HOMOPHONES}.get(kind)
    if table is not None:
        if low not in table:
            return None
        return words[:i] + [m["pre"] + _match_case(table[low], core) + m["post"]] + words[i + 1:]
    if kind == "doubled-word":
        if m["pre"] or m["post"] or len(core) < 2 or not core.islower():
            return None
        return words[:i] + [core] + words[i:]
    if kind == "missing-article":
        if i == 0 or core not in _ARTICLES or m["pre"] or m["post"]:
            return None
        return words[:i] + words[i + 1:]
    raise DraftsmanError(f"unknown grammar error {kind!r}")


def plant_errors(text: str, key: str, count: int) -> tuple[str, list[dict[str, Any]]]:
    """Up to `count` errors of different kinds in `text`, at positions picked by CRC-32 of
    `key`; each word is touched at most once, and never a neighbour of a touched word."""
    words = text.split(" ")
    touched: list[int] = []  # positions in the current word list
    errors: list[dict[str, Any]] = []
    start = zlib.crc32(key.encode()) % len(GRAMMAR_ERRORS)
    for kind in GRAMMAR_ERRORS[start:] + GRAMMAR_ERRORS[:start]:
        if len(errors) == count:
            break
        free = [i for i in range(len(words)) if all(abs(i - t) > 1 for t in touched)]
        fits = [i for i in free if _plant(kind, words, i) is not None]
        if not fits:
            continue
        i = fits[zlib.crc32(f"{key}:{kind}".encode()) % len(fits)]
        planted = _plant(kind, words, i)
        assert planted is not None
        shift = len(planted) - len(words)
        touched = [t + shift if t > i else t for t in touched] + [i]
        now = planted[i] if kind != "missing-article" else ""
        errors.append({"kind": kind, "word": words[i],
                       "now": f"{now} {now}" if kind == "doubled-word" else now})
        words = planted
    return " ".join(words), errors


def grammar() -> Iterator[Prompt]:
    for a in news_articles():
        taken: list[str] = []
        for p in a.paragraphs:
            taken.append(p)
            if sum(len(t.split()) for t in taken) >= GRAMMAR_MIN_WORDS:
                break
        original = " ".join(taken)
        planted, errors = plant_errors(original, a.id, GRAMMAR_ERRORS_PER_PROMPT)
        yield Prompt(
            id=f"grammar/{a.id}",
            dataset="grammar",
            task="rewrite",
            text=GRAMMAR_FORMAT.format(text=planted),
            reference=original,
            metadata={**a.meta(), "original": original, "planted": planted, "errors": errors},
        )
