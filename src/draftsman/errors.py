"""Errors a user can act on.

Every failure that comes from user input (a bad path, an unknown model, an invalid sampling
value, a prompt that does not fit) raises a `DraftsmanError`. The CLI prints its message on
one line and exits non-zero; the server turns it into an OpenAI-style error object.
"""


class DraftsmanError(Exception):
    """Base class: the message is meant for the user, one line, no traceback."""

    status = 400  # HTTP status the server answers with


class ModelNotFoundError(DraftsmanError):
    status = 404


class IntegrityError(DraftsmanError):
    """A downloaded or converted file does not match its pinned hash."""

    status = 500


class ContextOverflowError(DraftsmanError):
    """A prompt (plus the tokens asked for) does not fit in the model's context."""


class InvalidArgumentError(DraftsmanError):
    """An option, flag or request field has a value the method cannot take."""


class IncompatibleModelsError(DraftsmanError):
    """Draft and target cannot work together (e.g. different vocabularies)."""


class UnsupportedError(DraftsmanError):
    """A strategy needs a feature the chosen backend does not have."""


class OfflineError(DraftsmanError):
    """A hub (models or datasets) is not reachable from this machine."""

    status = 503


class BackendError(DraftsmanError):
    """A compute backend is missing or failed (llama.cpp not built, a GGUF it cannot load)."""

    status = 503


class DeviceError(InvalidArgumentError):
    """A --device that this machine does not have (cuda without CUDA, cuda:N past the last)."""
