"""Method specs for `draftsman bench --methods`: parse, expand sweeps, label.

One spec is ``NAME[:KEY=VALUE[,KEY=VALUE...]]``, e.g. ``speculative:gamma=4,draft=ngram``.

A list (``--methods``) separates specs with commas. Because options are comma-separated too,
an item of the form ``KEY=VALUE`` (no ``:`` before its ``=``) continues the options of the
spec before it: ``speculative:gamma=auto,gamma_policy=heuristic,autoregressive`` is two specs.
``;`` always starts a new spec.

Sweeps inside a value expand one spec into several configurations:

- ``a|b|c``: alternatives, in written order (``gamma=1|2|3``);
- ``lo..hi``: an inclusive range. The step is 1 when both ends are integers, otherwise
  10^-d where d is the largest number of decimals written in either end
  (``0.3..0.9`` -> 0.3, 0.4, ..., 0.9; ``0.25..0.5`` -> 0.25, 0.26, ..., 0.5);
- ``lo..hi..step``: an explicit step (``0.2..0.8..0.2``); values keep the decimals of the
  most precise of lo, hi and step, so labels are exact;
- parts combine: ``gamma=1..3|5|7`` -> 1, 2, 3, 5, 7.

Several swept options expand to their Cartesian product, the first written option varying
slowest. A range yields at most `MAX_RANGE` values.

``default`` (no options) stands for what `draftsman generate` runs by default; the runner
resolves it once the engine is loaded (strategies/default_method.py).

``engine=BACKEND[-DTYPE][+STEPS]`` (``torch-q4``, ``torch-q8``, ``torch-bf16``, ``llama.cpp``;
``+static`` for fixed-shape steps, ``+compiled`` for those fused by torch.compile) runs a
configuration on a second engine of the same target instead of the run's own, so that
backends, dtypes and step kinds are timed side by side in one interleaved run; it is part of
the label and of the recorded options, never passed to the method. It sweeps like any value
(``engine=torch-q4|torch-q8``).

Invariant: a `MethodConfig`'s label is its canonical spec text (name, then ``:`` and the
options in written order), so labels are unique per configuration and parse back to it.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from draftsman.errors import InvalidArgumentError
from draftsman.strategies.default_method import DEFAULT
from draftsman.strategies.registry import method_options

BASELINE = "autoregressive"
MAX_RANGE = 1000

_NAME = re.compile(r"^[A-Za-z][\w-]*$")
_KEY = re.compile(r"^[A-Za-z_][\w-]*$")


@dataclass(frozen=True)
class MethodConfig:
    """One benchmarked configuration: a registered method and its (string) options."""

    method: str
    options: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        if not self.options:
            return self.method
        return self.method + ":" + ",".join(f"{k}={v}" for k, v in self.options)

    def kwargs(self) -> dict[str, object]:
        """The method's options (not `engine`), numbers converted (``4`` -> 4, ``0.5`` ->
        0.5), keys with ``_``."""
        return {k.replace("-", "_"): coerce(v) for k, v in self.options if k != ENGINE}

    @property
    def engine(self) -> str:
        """The `engine=` option: "" for the run's own engine."""
        return dict(self.options).get(ENGINE, "")

    def without_engine(self) -> MethodConfig:
        return MethodConfig(self.method, tuple((k, v) for k, v in self.options if k != ENGINE))

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.options).get(key, default)


ENGINE = "engine"
ENGINE_BACKENDS = ("torch", "llama.cpp")


ENGINE_STEPS = ("", "static", "compiled")


def parse_engine(text: str) -> tuple[str, str | None]:
    """``torch-q4`` -> ("torch", "q4"); ``llama.cpp`` -> ("llama.cpp", None); a ``+static``
    or ``+compiled`` suffix (engine_static) is checked here and left out."""
    from draftsman.models.weight_formats import DTYPE_CHOICES

    name, _, steps = text.partition("+")
    backend, _, dtype = name.partition("-") if name != "llama.cpp" else (name, "", "")
    if (backend not in ENGINE_BACKENDS or (backend == "torch") != bool(dtype)
            or (dtype and dtype not in DTYPE_CHOICES) or steps not in ENGINE_STEPS
            or (steps and backend != "torch")):
        raise InvalidArgumentError(f"engine={text!r}: write torch-DTYPE (torch-q4, torch-q8, "
                                   "torch-bf16, torch-fp32), optionally +static or +compiled, "
                                   "or llama.cpp")
    return backend, dtype or None


def engine_static(text: str):
    """The `static` that `draftsman.load` takes for an `engine=` tag's +STEPS suffix."""
    from draftsman.models.static_step import StaticConfig

    steps = text.partition("+")[2]
    return StaticConfig(compile=True) if steps == "compiled" else steps == "static"


def coerce(value: str) -> object:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _split_items(text: str) -> list[str]:
    """Split a --methods value into single specs (see the module docstring)."""
    specs: list[str] = []
    for group in text.split(";"):
        current: list[str] = []
        for item in (s.strip() for s in group.split(",")):
            if not item:
                continue
            eq, colon = item.find("="), item.find(":")
            if eq > 0 and (colon < 0 or colon > eq):  # KEY=VALUE: continues the last spec
                if not current:
                    raise InvalidArgumentError(
                        f"method option {item!r} has no method before it "
                        "(write e.g. speculative:gamma=4)")
                current[-1] += ("," if ":" in current[-1] else ":") + item
            else:
                current.append(item)
        specs.extend(current)
    return specs


def _decimals(text: str) -> int:
    exponent = Decimal(text).as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _range_ends(part: str) -> list[Decimal] | None:
    """The numbers of ``lo..hi[..step]``, or None when `part` is not a numeric range."""
    ends = part.split("..")
    if len(ends) not in (2, 3):
        return None
    try:
        nums = [Decimal(e) for e in ends]
    except InvalidOperation:
        return None
    return nums if all(n.is_finite() for n in nums) else None


def expand_value(value: str) -> list[str]:
    """All values a (possibly swept) option value stands for, as exact strings."""
    out: list[str] = []
    for part in value.split("|"):
        part = part.strip()
        if not part:
            raise InvalidArgumentError(f"empty alternative in {value!r}")
        nums = _range_ends(part)
        if nums is None:  # a plain value (also a path such as ../models/x)
            out.append(part)
            continue
        ends = part.split("..")
        places = max(_decimals(e) for e in ends)
        lo, hi = nums[0], nums[1]
        step = nums[2] if len(nums) == 3 else Decimal(1).scaleb(-places)
        if step <= 0:
            raise InvalidArgumentError(f"range step must be positive in {part!r}")
        if hi < lo:
            raise InvalidArgumentError(f"range {part!r} runs backwards")
        count = int((hi - lo) / step) + 1
        if count > MAX_RANGE:
            raise InvalidArgumentError(f"range {part!r} has {count} values (max {MAX_RANGE})")
        quantum = Decimal(1).scaleb(-places)
        out.extend(str((lo + i * step).quantize(quantum)) for i in range(count))
    return out


def parse_spec(spec: str) -> list[MethodConfig]:
    """One spec -> its configurations (several when a value sweeps), each checked against
    its method's declared options (`strategies/options.py`); nothing is loaded."""
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not _NAME.match(name):
        raise InvalidArgumentError(f"bad method name {name!r} in {spec!r}")
    keys: list[str] = []
    choices: list[list[str]] = []
    for item in (s.strip() for s in rest.split(",")) if rest else ():
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not _KEY.match(key) or not value.strip():
            raise InvalidArgumentError(f"bad option {item!r} in {spec!r}; write KEY=VALUE")
        if key in keys:
            raise InvalidArgumentError(f"option {key!r} given twice in {spec!r}")
        keys.append(key)
        choices.append(expand_value(value.strip()))
    if name == DEFAULT:
        if keys:
            raise InvalidArgumentError(f"{DEFAULT} takes no options in {spec!r}: it times "
                                       "what `draftsman generate` runs by default")
        return [MethodConfig(DEFAULT)]
    configs = [MethodConfig(name, tuple(zip(keys, combo, strict=True)))
               for combo in itertools.product(*choices)]
    for config in configs:
        method_options(config.method, config.kwargs())
        if config.engine:
            parse_engine(config.engine)
    return configs


def parse_methods(texts: str | list[str]) -> list[MethodConfig]:
    """Every configuration named by one or more --methods values, baseline first, no
    duplicates (by label), order otherwise as written."""
    if isinstance(texts, str):
        texts = [texts]
    configs = [MethodConfig(BASELINE)]
    seen = {configs[0].label}
    for text in texts:
        for spec in _split_items(text):
            for config in parse_spec(spec):
                if config.label not in seen:
                    seen.add(config.label)
                    configs.append(config)
    return configs
