"""The converted folder's tokenizer, built by transformers from the GGUF vocabulary.

transformers turns the GGUF vocabulary and merges into a `tokenizers` tokenizer; we add
what it leaves out (see `save_gguf_tokenizer`) and save tokenizer.json plus a
tokenizer_config.json carrying the chat template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftsman.errors import UnsupportedError


def save_gguf_tokenizer(
    gguf_path: Path,
    out_dir: Path,
    *,
    split_digits: bool,
    chat_template: str | None,
    context_length: int | None,
) -> None:
    """Write tokenizer.json + tokenizer_config.json for the GGUF's vocabulary into out_dir.

    - `split_digits`: llama.cpp's `smollm` pre-tokenizer isolates every digit before the
      GPT-2 split; transformers applies only the GPT-2 split, so we add the digit split.
    - `chat_template`: the GGUF's `tokenizer.chat_template`, stored verbatim.
    - `context_length`: becomes `model_max_length` (transformers leaves it unbounded).
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if split_digits:
        _split_digits(tok)
    if chat_template is not None:
        tok.chat_template = chat_template
    if context_length is not None:
        tok.model_max_length = int(context_length)
    # save_jinja_files=False keeps the chat template inside tokenizer_config.json, where
    # every version of transformers (and non-transformers readers) looks for it.
    tok.save_pretrained(str(out_dir), save_jinja_files=False)


def _split_digits(tok: Any) -> None:
    from tokenizers import pre_tokenizers

    backend = tok.backend_tokenizer
    if not isinstance(backend.pre_tokenizer, pre_tokenizers.ByteLevel):
        raise UnsupportedError("unexpected pre-tokenizer for a GGUF 'smollm' vocabulary")
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
