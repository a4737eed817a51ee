"""Where weights come from: catalogue, pull, verify, convert, resolve.

Everything above this layer loads a Hugging Face-style folder; call `resolve_model(spec)` to
get one (catalogue name, local folder, .gguf file or hf:owner/name). Importing this package
does not import torch: conversion modules load on first use.
"""

from draftsman.store.catalogue import CATALOGUE, CatalogueEntry, catalogue_names, get_entry
from draftsman.store.home import draftsman_home
from draftsman.store.pull import pull_model, remove_model
from draftsman.store.resolve import ensure_model, resolve_gguf, resolve_model
from draftsman.store.status import model_status, verify_model

__all__ = [
    "CATALOGUE",
    "CatalogueEntry",
    "catalogue_names",
    "draftsman_home",
    "ensure_model",
    "get_entry",
    "model_status",
    "pull_model",
    "remove_model",
    "resolve_gguf",
    "resolve_model",
    "verify_model",
]
