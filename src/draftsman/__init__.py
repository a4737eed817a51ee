"""draftsman: faster LLM generation without changing what is generated."""

from draftsman.engine import DEFAULT_DRAFT, DEFAULT_TARGET, Engine, Result, generate, load
from draftsman.errors import DraftsmanError

__all__ = ["DEFAULT_DRAFT", "DEFAULT_TARGET", "DraftsmanError", "Engine", "Result", "generate",
           "load"]
__version__ = "0.1.0"
