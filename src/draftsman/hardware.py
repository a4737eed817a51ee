"""What this CPU is and can do, read once from /proc/cpuinfo (Linux; fallbacks elsewhere)."""

from __future__ import annotations

import functools
import platform


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # end of the first processor's block; the others repeat it
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (`avx2`, `avx512_bf16`, `amx_int8`, ...); empty if unknown."""
    return frozenset(_cpuinfo().get("flags", "").split())


def cpu_model() -> str:
    """The CPU's marketing name, e.g. 'Intel(R) Xeon(R) Processor'."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_kind() -> tuple[str, int]:
    """(vendor, family) as /proc/cpuinfo names them: ("AuthenticAMD", 26) on a Zen 5,
    ("GenuineIntel", 6) on a Xeon; ("", 0) if unknown."""
    fields = _cpuinfo()
    family = fields.get("cpu family", "")
    return fields.get("vendor_id", ""), int(family) if family.isdigit() else 0
