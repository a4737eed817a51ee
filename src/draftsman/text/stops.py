"""User stop strings: where they cut the text, and how much text to hold back."""

from __future__ import annotations


class StopMatcher:
    """Finds user stop strings in the decoded text and holds back text that might start one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, start: int = 0) -> int | None:
        """Index of the earliest stop string in text[start:] (an index into `text`)."""
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        """Length of the prefix that cannot become part of a stop string later.

        Looks only at the last `longest - 1` characters, so a tail of at least that many
        characters gives the same hold-back as the whole text.
        """
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        return len(text) - hold
