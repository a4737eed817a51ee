"""Tiny model folders for dry runs and tests: a byte-level BPE tokenizer trained on three
sentences, a tiny Llama config of its vocabulary, a three-prompt dataset."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = ["def add(xs): return sum(xs)", "the cat sat on the mat",
          "speculative decoding drafts tokens and the target verifies them"]


def tiny_tokenizer(folder: Path) -> int:
    """Write tokenizer.json + tokenizer_config.json (eos "<eos>", id 0); the vocabulary size.
    Training is deterministic: two folders get the same tokenizer (a target and its draft)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    return tok.get_vocab_size()


def tiny_config_folder(folder: Path, layers: int = 2) -> Path:
    """A folder holding a tiny Llama's config.json and the tiny tokenizer (no weights:
    `store.random_weights.write_random_folder` draws them)."""
    import transformers

    vocab = tiny_tokenizer(folder)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        eos_token_id=0, bos_token_id=None, tie_word_embeddings=False)
    config.save_pretrained(str(folder))
    return folder


def tiny_dataset(path: Path) -> Path:
    """A .jsonl of three prompts the tiny tokenizer knows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [{"id": "add", "prompt": "def add(xs): return", "reference": " sum(xs)"},
               {"id": "cat", "prompt": "the cat sat on", "reference": "the mat"},
               {"id": "spec", "prompt": "speculative decoding drafts", "reference": "tokens"}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path
