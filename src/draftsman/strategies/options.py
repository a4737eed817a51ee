"""Method options: one frozen dataclass per method, one parser for all of them.

A method declares its options as dataclass fields made with `option(...)`: a default, a
one-line help, the kind of value (int, float or str), words it accepts besides a value of
that kind ('auto', 'off'), allowed choices and numeric bounds. `parse(cls, values, method)`
builds the dataclass from strings (CLI `--option k=v`, benchmark specs) or JSON values (the
server, Python keywords) and raises `OptionError` - one line, naming the option - for an
unknown option, a value of the wrong kind or a value out of range. Parsing never loads a
model, so every front end validates first and builds after.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from draftsman.errors import InvalidArgumentError

KIND_NAMES = {int: "an integer", float: "a number", str: "a string"}


class OptionError(InvalidArgumentError):
    """A bad method option. `option` names it; `kind` is 'unknown', 'type' or 'value'.

    The server answers 422 for an unknown option or a value of the wrong kind, and 400 for
    a well-typed value out of range (as it always has)."""

    def __init__(self, message: str, option: str, kind: str) -> None:
        super().__init__(message)
        self.option = option
        self.kind = kind
        self.status = 400 if kind == "value" else 422


@dataclass(frozen=True)
class Spec:
    """What one option accepts (stored in the field's metadata under "option")."""

    help: str
    kind: type = str
    choices: tuple[str, ...] | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)  # other spellings of a choice
    words: Mapping[str, Any] = field(default_factory=dict)  # 'auto' -> 'auto', 'off' -> inf
    minimum: float | None = None
    maximum: float | None = None

    def describe(self) -> str:
        """The accepted values in words: 'an integer >= 1 or 'auto''."""
        if self.choices:
            text = "one of " + ", ".join(self.choices)
        else:
            text = KIND_NAMES[self.kind]
            if self.minimum is not None and self.maximum is not None:
                text += f" in [{self.minimum:g}, {self.maximum:g}]"
            elif self.minimum is not None:
                text += f" >= {self.minimum:g}"
        return text + "".join(f" or '{w}'" for w in self.shown_words())

    def type_name(self) -> str:
        return " | ".join([self.kind.__name__, *(repr(w) for w in self.shown_words())])

    def shown_words(self) -> list[str]:
        """The first spelling of each special value ('off', not also 'none' and 'inf')."""
        seen: list[Any] = []
        shown = []
        for word, value in self.words.items():
            if word and not any(value is v or value == v for v in seen):
                seen.append(value)
                shown.append(word)
        return shown


def option(default: Any, help: str, *, kind: type = str, choices: tuple[str, ...] | None = None,
           aliases: Mapping[str, str] | None = None, words: Mapping[str, Any] | None = None,
           minimum: float | None = None, maximum: float | None = None) -> Any:
    """A dataclass field declaring one method option (see the module docstring)."""
    spec = Spec(help, kind, choices, dict(aliases or {}), dict(words or {}), minimum, maximum)
    return field(default=default, metadata={"option": spec})


@dataclass(frozen=True)
class MethodOptions:
    """Base of every method's options. `aliases` maps another name of an option to it."""

    aliases: ClassVar[Mapping[str, str]] = {}

    def needs(self) -> dict[str, str]:
        """Capabilities (models/protocol.py) the target must declare: name -> why."""
        return {}


Options = TypeVar("Options", bound=MethodOptions)


def specs(cls: type[MethodOptions]) -> dict[str, tuple[Spec, Any]]:
    """name -> (spec, default) of every declared option, in declaration order."""
    return {f.name: (f.metadata["option"], f.default) for f in dataclasses.fields(cls)}


def takes(cls: type[MethodOptions], name: str) -> bool:
    return name in specs(cls)


def _fail(method: str, name: str, spec: Spec, value: Any, kind: str) -> OptionError:
    return OptionError(f"{method}: {name} must be {spec.describe()}, got {value!r}", name, kind)


def _number(value: Any, kind: type) -> int | float | None:
    """`value` as an int or float, None when it is not one (bools are not numbers)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number):
        return None
    if kind is float:
        return number
    return int(number) if number.is_integer() else None


def convert(method: str, name: str, spec: Spec, value: Any) -> Any:
    """One value -> the option's Python value, or OptionError naming `name`."""
    if isinstance(value, str) and value.strip().lower() in spec.words:
        return spec.words[value.strip().lower()]
    if spec.kind is str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise _fail(method, name, spec, value, "type")
        text = str(value).strip()
        if spec.choices is None:
            return text
        key = text.lower()
        key = spec.aliases.get(key, key)
        if key not in spec.choices:
            raise _fail(method, name, spec, value, "value")
        return key
    number = _number(value, spec.kind)
    if number is None:
        raise _fail(method, name, spec, value, "type")
    if (spec.minimum is not None and number < spec.minimum) or (
            spec.maximum is not None and number > spec.maximum):
        raise _fail(method, name, spec, value, "value")
    return number


def parse(cls: type[Options], values: Mapping[str, Any], method: str) -> Options:
    """Build `cls` from option values (strings or JSON scalars; None means the default)."""
    declared = specs(cls)
    given: dict[str, Any] = {}
    for key, value in values.items():
        name = cls.aliases.get(key, key)
        if name in given and given[name] != value:
            raise OptionError(f"{method}: give {name} or {key}, not both", name, "value")
        given[name] = value
    unknown = sorted(k for k in values if cls.aliases.get(k, k) not in declared)
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(unknown)} for {method}; valid: "
                          f"{', '.join(sorted(declared)) or 'none'}", unknown[0], "unknown")
    out = {name: convert(method, name, declared[name][0], value)
           for name, value in given.items() if value is not None}
    return cls(**out)


def help_lines(cls: type[MethodOptions]) -> list[str]:
    """One line per option: name, type, default, choices and help (for --help-options)."""
    lines = []
    for name, (spec, default) in specs(cls).items():
        choices = f"  choices: {', '.join(spec.choices)}" if spec.choices else ""
        lines.append(f"  {name} ({spec.type_name()}, default {default!r}){choices}\n"
                     f"      {spec.help}")
    return lines
