"""The copy-heavy workloads (code-edit, rag-qa, grammar) on the real, hash-pinned files."""

from __future__ import annotations

import ast
import re
from collections import Counter

import pytest

from draftsman.bench import datasets as ds
from draftsman.bench.copy_workloads import EDIT_KINDS, plant_errors
from draftsman.bench.quality import humaneval_program, run_program

COUNTS = {"code-edit": 164, "rag-qa": 70, "grammar": 70}


@pytest.fixture(scope="module")
def edits() -> list[ds.Prompt]:
    return ds.load_dataset("code-edit")


@pytest.mark.parametrize("name", list(COUNTS))
def test_listed_ordered_unique_deterministic(name: str) -> None:
    listed = {info.name: info for info in ds.list_datasets()}
    assert listed[name].records == COUNTS[name] and listed[name].description
    full = ds.load_dataset(name)
    assert len(full) == COUNTS[name] and len({p.id for p in full}) == len(full)
    assert all(p.dataset == name and p.id.startswith(f"{name}/") for p in full)
    assert ds.load_dataset(name) == full
    assert ds.load_dataset(name, limit=3) == full[:3]


def test_news_sets_follow_the_article_order() -> None:
    articles = [p.id for p in ds.load_dataset("news-summarization")]
    assert [p.id.split("/", 1)[1] for p in ds.load_dataset("rag-qa")] == articles
    assert [p.id.split("/", 1)[1] for p in ds.load_dataset("grammar")] == articles


def test_code_edit_rotates_kinds(edits: list[ds.Prompt]) -> None:
    assert [p.metadata["edit"] for p in edits[:5]] == list(EDIT_KINDS)
    assert set(Counter(p.metadata["edit"] for p in edits)) == set(EDIT_KINDS)
    assert edits[0].id == "code-edit/0" and edits[0].metadata["task_id"] == "HumanEval/0"
    for p in edits:
        m = p.metadata
        assert f"```python\n{m['shown']}```" in p.text
        assert "whole changed function" in p.text
        compile(m["shown"], p.id, "exec")
        if m["edit"] in ("fix-bug", "type-hints", "docstring"):
            assert p.reference == m["original"] and m["shown"] != m["original"]
        if m["edit"] == "port":
            assert p.reference is None and m["shown"] == m["original"]


def test_planted_bugs_break_the_tests(edits: list[ds.Prompt]) -> None:
    bugs = [p for p in edits if p.metadata["edit"] == "fix-bug"]
    assert len(bugs) >= 30
    for p in bugs[:10]:
        m = p.metadata
        diff = [(a, b) for a, b in zip(m["original"].splitlines(), m["shown"].splitlines(),
                                       strict=True) if a != b]
        assert len(diff) == 1 and m["was"] in diff[0][0] and m["now"] in diff[0][1]
        fixed = f"```python\n{m['original']}```"
        planted = f"```python\n{m['shown']}```"
        assert run_program(humaneval_program(fixed, m), 10)[0]
        assert not run_program(humaneval_program(planted, m), 10)[0]


def _function(code: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.parse(code).body
                if isinstance(n, ast.FunctionDef) and n.name == name)


def test_type_hints_and_docstring_are_removed(edits: list[ds.Prompt]) -> None:
    for p in edits:
        m = p.metadata
        if m["edit"] == "type-hints":
            fn = _function(m["shown"], m["entry_point"])
            assert fn.returns is None and all(a.annotation is None for a in fn.args.args)
            before = _function(m["original"], m["entry_point"])
            assert before.returns is not None or any(a.annotation for a in before.args.args)
            # only annotations went: the code without them is the original's
            assert ast.dump(fn.body[-1]) == ast.dump(
                _function(m["original"], m["entry_point"]).body[-1])
        if m["edit"] == "docstring":
            fn = _function(m["shown"], m["entry_point"])
            assert ast.get_docstring(fn) is None
            assert ast.get_docstring(_function(m["original"], m["entry_point"]))


def test_rename_reference_passes_under_the_new_name(edits: list[ds.Prompt]) -> None:
    renames = [p for p in edits if p.metadata["edit"] == "rename"]
    assert renames
    for p in renames:
        m = p.metadata
        assert m["entry_point"] == m["new_name"] != m["old_name"]
        assert "_" not in m["new_name"] and m["new_name"] in p.text
        assert not re.search(rf"\b{m['old_name']}\b", p.reference or "")
    m = renames[0].metadata
    assert run_program(humaneval_program(f"```python\n{renames[0].reference}```", m), 10)[0]


def test_rag_qa_pastes_the_article_and_asks_for_quotes() -> None:
    qa = ds.load_dataset("news-qa")
    for rag, plain in zip(ds.load_dataset("rag-qa"), qa, strict=True):
        assert rag.metadata["question"] == plain.metadata["question"]
        assert rag.metadata["context"] in rag.text and rag.metadata["title"] in rag.text
        assert "word for word" in rag.text and rag.text.endswith(rag.metadata["question"])


def test_grammar_errors_really_planted() -> None:
    prompts = ds.load_dataset("grammar")
    bodies = [" ".join(s.metadata["context"].split("\n"))
              for s in ds.load_dataset("news-summarization")]
    for p, body in zip(prompts, bodies, strict=True):
        m = p.metadata
        assert p.reference == m["original"] and p.text.endswith(m["planted"])
        assert m["planted"] != m["original"] and len(m["errors"]) >= 2
        assert len({e["kind"] for e in m["errors"]}) == len(m["errors"])
        assert body.startswith(m["original"])
        assert len(m["original"].split()) >= 60 or m["original"] == body
    kinds = Counter(e["kind"] for p in prompts for e in p.metadata["errors"])
    assert set(kinds) == {"agreement", "homophone", "doubled-word", "missing-article"}


def test_plant_errors_on_a_hand_built_sentence() -> None:
    text = ("The company said on Monday that there is a plan to sell the unit to its rival, "
            "and the board has agreed to the sale; in New York its shares were higher.")
    planted, errors = plant_errors(text, "k", 4)
    assert len(errors) == 4 and planted != text
    words, new = text.split(), planted.split()
    assert len(new) == len(words)  # one word doubled, one article dropped
    for e in errors:
        if e["kind"] in ("agreement", "homophone"):
            assert e["now"] in new and e["now"].lower() != e["word"].lower()
        if e["kind"] == "doubled-word":
            assert e["now"] in planted
    assert plant_errors(text, "k", 4) == (planted, errors)
    assert plant_errors(text, "k", 1)[1] == errors[:1]
