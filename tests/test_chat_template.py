"""The chat template: rendered as Jinja renders it, compiled once per distinct template."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from draftsman.errors import DraftsmanError
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
