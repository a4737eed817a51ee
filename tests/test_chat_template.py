"""The chat template: rendered as Jinja renders it, compiled once per distinct template."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from draftsman.errors import DraftsmanError, IncompatibleModelsError
from draftsman.testing.tiny_models import tiny_tokenizer
from draftsman.text.tokenizer import Tokenizer

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture
def tokenizer(tmp_path: Path) -> Tokenizer:
    tiny_tokenizer(tmp_path)
    tok = Tokenizer.from_folder(tmp_path)
    tok.chat_template = TEMPLATE
    return tok


def test_the_template_renders_every_message_and_the_generation_prompt(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "the cat"}])
    assert text == "<|system|>be brief\n<|user|>the cat\n<|assistant|>"


def test_the_template_is_compiled_once_not_per_request(tokenizer, monkeypatch):
    compiled: list[str] = []
    real = jinja2.Environment.from_string

    def counting(self, source, *args, **kwargs):
        compiled.append(source)
        return real(self, source, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "from_string", counting)
    tokenizer.chat_template = TEMPLATE + "{# a template no other test compiled #}"
    for content in ("the cat", "the mat", "def add"):
        assert tokenizer.apply_chat_template([{"role": "user", "content": content}]).endswith(
            f"{content}\n<|assistant|>")
    assert len(compiled) == 1
    tokenizer.chat_template = TEMPLATE + "{# another #}"  # a changed template is recompiled
    tokenizer.apply_chat_template([{"role": "user", "content": "x"}])
    assert len(compiled) == 2


def test_a_broken_template_fails_with_one_clear_error_every_time(tokenizer):
    tokenizer.chat_template = "{% for m in messages %}"  # never closed
    for _ in range(2):  # a failed compile is not cached as a success
        with pytest.raises(DraftsmanError, match="chat template failed"):
            tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


def test_a_tokenizer_file_shared_by_two_models_is_parsed_once(tmp_path: Path):
    """A target and its draft usually ship the same tokenizer.json: one parse, one object
    (check_same_vocabulary then compares nothing); another file is parsed apart."""
    from draftsman.text.tokenizer import check_same_vocabulary

    for name in ("target", "draft", "other"):
        tiny_tokenizer(tmp_path / name)
    other = tmp_path / "other" / "tokenizer.json"
    other.write_text(other.read_text().replace('"version"', '"version" ', 1))
    target, draft, third = (Tokenizer.from_folder(tmp_path / n)
                            for n in ("target", "draft", "other"))
    assert target.backend is draft.backend and third.backend is not target.backend
    assert third.vocab == target.vocab
    check_same_vocabulary(target, draft, "target", "draft")
    check_same_vocabulary(target, third, "target", "other")
    data = json.loads(other.read_text())  # two tokens' ids swapped: a different vocabulary
    vocab = data["model"]["vocab"]
    a, b = list(vocab)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    other.write_text(json.dumps(data))
    with pytest.raises(IncompatibleModelsError, match="different vocabularies"):
        check_same_vocabulary(target, Tokenizer.from_folder(tmp_path / "other"), "t", "o")
