"""OpenAI wire format: request bodies (validated), response objects, stream chunks, errors.

Request models are *strict*: a string where a number is expected, a float where an integer is
expected, or a bool where a number is expected is a type error (HTTP 422), never coerced.
Unknown top-level fields are ignored, as OpenAI clients send many we do not use; fields that
would change the output in ways draftsman cannot honour (n > 1, echo, logprobs, penalties,
tools, ...) are refused with 400 by `unsupported_fields`, never silently dropped.

Responses are plain dicts in OpenAI's shapes with one extra key, `draftsman`, holding the
method and the acceptance statistics of the request.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Scalar = str | int | float | bool | None


class ApiError(Exception):
    """An error answered as an OpenAI error object with `status` (and optional headers)."""

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code="unsupported_parameter" if param else None, param=param)

# finish reasons of the engine -> OpenAI's
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


class DraftsmanOptions(BaseModel):
    """The `draftsman` extension object: `{"method": "speculative", "gamma": "auto", ...}`.

    `method` names a strategy; every other key is passed to it as a method option. Option
    values must be JSON scalars (the strategies take names and numbers only).
    """

    model_config = ConfigDict(strict=True, extra="allow")

    method: str | None = None

    @property
    def options(self) -> dict[str, Scalar]:
        return dict(self.model_extra or {})

    @field_validator("method")
    @classmethod
    def _method_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("method must not be empty")
        return value

    @model_validator(mode="after")
    def _scalar_options(self) -> DraftsmanOptions:
        for key, value in self.options.items():
            if not isinstance(value, str | int | float | bool | type(None)):
                raise ValueError(f"draftsman option {key!r} must be a string, number or bool")
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = False


class _GenerationRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None  # not OpenAI; vLLM and llama.cpp accept it too (-1 or 0 = off)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None
    draftsman: DraftsmanOptions | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def unsupported_fields(self) -> None:
        """Raise 400 for values draftsman cannot honour exactly."""
        if self.n != 1:
            raise bad_request(f"only n=1 is supported, got n={self.n}", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0, 0.0):
                raise bad_request(f"{name} is not supported", param=name)
        if self.logit_bias:
            raise bad_request("logit_bias is not supported", param="logit_bias")
        if self.logprobs not in (None, False, 0):
            raise bad_request("logprobs are not supported", param="logprobs")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options needs stream: true",
                                       param="stream_options")


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions. `prompt` is a string or token ids (a batch of one is accepted)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def single_prompt(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise bad_request(
                    f"one prompt per request is supported, got {len(prompt)}", param="prompt")
            return prompt[0]
        return prompt

    def unsupported_fields(self) -> None:
        super().unsupported_fields()
        if self.echo:
            raise bad_request("echo is not supported", param="echo")
        if self.suffix:
            raise bad_request("suffix is not supported", param="suffix")
        if self.best_of not in (None, 1):
            raise bad_request("only best_of=1 is supported", param="best_of")


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_message(self) -> dict[str, str]:
        """A `{"role", "content"}` dict for the chat template; text parts are joined."""
        content = self.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            if any(part.type != "text" or part.text is None for part in content):
                raise bad_request("only text content parts are supported",
                                           param="messages")
            text = "".join(part.text or "" for part in content)
        return {"role": self.role, "content": text}


class ChatCompletionRequest(_GenerationRequest):
    """POST /v1/chat/completions: the model's chat template is applied to `messages`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    top_logprobs: int | None = None

    def template_messages(self) -> list[dict[str, str]]:
        return [m.as_template_message() for m in self.messages]

    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def unsupported_fields(self) -> None:
        super().unsupported_fields()
        if self.tools:
            raise bad_request("tools are not supported", param="tools")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise bad_request("only response_format type 'text' is supported",
                                       param="response_format")
        if self.top_logprobs:
            raise bad_request("logprobs are not supported", param="top_logprobs")


# ---- responses ---------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(*, kind: str, rid: str, created: int, model: str, text: str,
                    finish_reason: str | None, usage_: dict[str, int],
                    stats: dict[str, Any]) -> dict[str, Any]:
    """A whole (non-streamed) `text_completion` or `chat.completion` object."""
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": finish_reason, "logprobs": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage_, "draftsman": stats}


def chunk_body(*, kind: str, rid: str, created: int, model: str, text: str | None = None,
               role: bool = False, finish_reason: str | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One stream chunk; `role=True` makes the opening chat chunk (`delta.role`)."""
    if kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
            delta["content"] = ""
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish_reason,
                  "logprobs": None}
        obj = "text_completion"
    out = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
    if extra:
        out.update(extra)
    return out


def usage_chunk(*, kind: str, rid: str, created: int, model: str, usage_: dict[str, int],
                stats: dict[str, Any]) -> dict[str, Any]:
    """The last chunk when `stream_options.include_usage`: no choices, the usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage_, "draftsman": stats}


ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
               404: "invalid_request_error",
               413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error", 499: "invalid_request_error", 500: "server_error",
               503: "server_error"}


def error_body(status: int, message: str, *, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event: a JSON body (compact) or a bare string such as [DONE]."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n"
