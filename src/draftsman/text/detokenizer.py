"""Incremental detokenisation: the text of a growing token list in O(new tokens) per step.

Decoding the whole output after every step costs O(n) per step, O(n^2) per request. Here each
step decodes only a window: the tokens since the last point where the text was final, plus the
tokens of the step before as left context. The new text is decode(context + new) minus
decode(context), not decode(new), because a tokenizer's decode of a suffix can differ from the
suffix of its decode (byte-level pieces, a leading space dropped from the first token, words
joined with spaces).

    ids:   [ ........ final ........ | context | new tokens ]
                                     ^prefix   ^read
"""

from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"  # what a decoder writes for an incomplete UTF-8 character


class Detokenizer:
    """Text of a growing token list, decoding only a window per step.

    Invariant: the text made final so far plus `pending` equals decode(ids), for decoders
    whose text of a prefix that does not end in U+FFFD is a prefix of the text of every
    extension (byte-level BPE, Metaspace, WordPiece, word-level: every tokenizer we ship).
    Text becomes final only where it does not end in U+FFFD, so a multi-byte character split
    across tokens is held in `pending` until its last byte arrives.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix = 0  # window start: a token boundary where the text was final
        self._read = 0  # tokens whose text is final
        self._prefix_text = ""  # decode(ids[_prefix:_read])
        self.final_length = 0  # characters of final text
        self.pending = ""  # text of ids[_read:]; may end in U+FFFD

    def peek(self, tokens: list[int]) -> str:
        """Text of ids + tokens after the final point (the state is unchanged)."""
        window = self.ids[self._prefix:] + list(tokens)
        return self._decode(window)[len(self._prefix_text):]

    def push(self, tokens: list[int]) -> str:
        """Append tokens; the text after the previous final point (final part + pending)."""
        tail = self.peek(tokens)
        self.commit(tokens, tail)
        return tail

    def commit(self, tokens: list[int], tail: str) -> str:
        """Append tokens whose `peek` was `tail`; returns the text that became final."""
        self.ids.extend(tokens)
        if not tail or tail.endswith(REPLACEMENT):
            self.pending = tail
            return ""
        context = self._decode(self.ids[self._read:])
        if context:
            self._prefix, self._prefix_text = self._read, context
        else:  # tokens that decode to nothing (special tokens) are no context: keep the old
            self._prefix_text += tail
        self._read = len(self.ids)
        self.final_length += len(tail)
        self.pending = ""
        return tail
