"""The text a user sees of a generation: token steps in, text deltas out, cut at stop strings.

Per step the cost is O(new tokens + longest stop): the detokeniser decodes a short window,
stop strings are searched in the new text plus the `longest - 1` characters before it (an
earlier match would have ended the stream already), and only the unsent tail is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from draftsman.text.detokenizer import REPLACEMENT, Detokenizer
from draftsman.text.stops import StopMatcher


@dataclass
class Delta:
    tokens: list[int]  # the step's tokens up to and including the one that completes a stop
    text: str  # text to emit now
    finish: str | None  # the step's finish reason, or "stop" at a stop string


class TextStream:
    """Turns committed token steps into text deltas.

    Invariants: the deltas joined equal decode(all kept tokens), cut before the first stop
    string; text that could still become the start of a stop string, or an incomplete
    character (U+FFFD at the end), is held back until the next step or the finish.
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: StopMatcher) -> None:
        self.stops = stops
        self._context = max(stops.longest - 1, 0)  # characters a stop can reach back
        self.detok = Detokenizer(decode)
        self._base = 0  # absolute index of _kept[0] in the text
        self._kept = ""  # final text from _base: the unsent part plus stop-search context
        self._sent = 0  # characters emitted so far

    def push(self, tokens: list[int], finish: str | None = None) -> Delta:
        tail = self.detok.peek(tokens)
        text = self._kept + tail  # the whole text from _base
        # a match must end in the new text: it starts at most longest - 1 before it
        search = max(self.detok.final_length - self._context, 0) - self._base
        cut = self.stops.find(text, search) if self.stops.stops else None
        if cut is not None:
            tokens = self._tokens_to_stop(tokens, search)
            text, finish = text[:cut], "stop"
            safe = len(text)
        elif finish is not None:
            safe = len(text)
        else:
            safe = self.stops.safe_length(text.rstrip(REPLACEMENT))
        sent = self._sent - self._base
        delta = text[sent:safe]
        self._sent = self._base + max(sent, safe)
        if finish is None:
            self._advance(tokens, tail)
        return Delta(list(tokens), delta, finish)

    def _tokens_to_stop(self, tokens: list[int], search: int) -> list[int]:
        """The fewest leading tokens whose text reaches a stop string."""
        for n in range(1, len(tokens)):
            if self.stops.find(self._kept + self.detok.peek(tokens[:n]), search) is not None:
                return tokens[:n]
        return tokens

    def _advance(self, tokens: list[int], tail: str) -> None:
        self._kept += self.detok.commit(tokens, tail)
        # keep the unsent final text and the longest - 1 characters before it
        base = max(min(self._sent, self.detok.final_length) - self._context, 0)
        self._kept = self._kept[base - self._base:]
        self._base = base
