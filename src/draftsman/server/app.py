"""The OpenAI-compatible HTTP API around one loaded `Engine`.

    app = create_app(engine, ServerSettings(model_name="qwen2.5-coder-1.5b-instruct",
                                            method="speculative", options={"gamma": "auto"}))

Request life cycle (each step may answer with an OpenAI error object instead):
1. FastAPI validates the body strictly (422 on wrong types);
2. `_prepare` checks the model name (404), refused fields (400), the method (400) and its
   options against the method's declaration (422 for an unknown option or a value of the
   wrong type, 400 for one out of range, with `param` naming it; 404 for a draft that is not
   resident), tokenises the prompt (413 above `max_prompt_tokens`), checks `max_tokens`
   against the cap and the context (400) and builds the engine `Request` - all in a helper
   thread, before any queueing;
3. the `Scheduler` admits it (429 with Retry-After when full) and a worker thread generates;
4. events come back through an asyncio queue: collected into one JSON body, or sent as SSE
   chunks ending with `data: [DONE]`.

Every request to a generation endpoint is counted exactly once in the metrics, with its
final status; a client that goes away cancels its job, which stops at the next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

import draftsman
from draftsman.engine import Engine
from draftsman.errors import ContextOverflowError, DraftsmanError, ModelNotFoundError
from draftsman.server.auth import ANONYMOUS
from draftsman.server.engine_thread import EngineThread
from draftsman.server.schemas import (
    FINISH_REASONS,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    bad_request,
    chunk_body,
    completion_body,
    error_body,
    new_id,
    now,
    sse,
    usage,
    usage_chunk,
)
from draftsman.server.service import Call, Prepared, Server, ServerSettings
from draftsman.server.worker import Finished, Job, Tally
from draftsman.strategies.options import OptionError
from draftsman.strategies.registry import METHODS

log = logging.getLogger("draftsman.server")

ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.status, exc.message, code=exc.code, param=exc.param),
                        status_code=exc.status, headers=exc.headers)


def as_api_error(exc: BaseException) -> ApiError:
    """Any failure -> the error object the client sees (500 for bugs, logged)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, OptionError):  # names the option inside the draftsman object
        return ApiError(exc.status, str(exc), code="invalid_option",
                        param=f"draftsman.{exc.option}")
    if isinstance(exc, DraftsmanError):
        code = ("model_not_found" if isinstance(exc, ModelNotFoundError)
                else "context_length_exceeded" if isinstance(exc, ContextOverflowError)
                else None)
        return ApiError(exc.status, str(exc), code=code)
    log.error("internal error", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


class JobStream(StreamingResponse):
    """An SSE response that, however it ends (done, client gone, shutdown), cancels its job
    and counts the request once."""

    def __init__(self, content: AsyncIterator[str], on_close: Any) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _wait_for_disconnect(request: Request, job: Job) -> None:
    """Cancel `job` when the client closes the connection (body already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def create_app(engine: Engine, settings: ServerSettings, *,
               engine_thread: EngineThread | None = None) -> FastAPI:
    """The FastAPI app; the scheduler's workers run between lifespan start and shutdown
    (the batch loop on `engine_thread` when given: server/engine_thread.py)."""
    server = Server(engine, settings, engine_thread=engine_thread)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.scheduler.start()
        log.info("serving %s (default method %s %s, %d worker(s), queue %d)",
                 settings.model_name, settings.method, settings.options, settings.parallel,
                 settings.max_queue)
        try:
            yield
        finally:
            server.scheduler.close()
            log.info("stopped")

    async def authenticate(request: Request) -> None:
        """Every route: 401 for /v1/* without a valid key, else the history scope."""
        request.state.scope = server.keys.scope(request.headers.get("authorization")) \
            if server.keys.protects(request.url.path) else ANONYMOUS

    app = FastAPI(title="draftsman", version=draftsman.__version__, lifespan=lifespan,
                  dependencies=[Depends(authenticate)])
    app.state.server = server

    def call_of(request: Request) -> Call | None:
        endpoint = ENDPOINTS.get(request.url.path)
        if endpoint is None:
            return None
        call = getattr(request.state, "call", None)
        if call is None:
            call = request.state.call = Call(endpoint)
        return call

    def fail(request: Request, exc: BaseException) -> JSONResponse:
        error = as_api_error(exc)
        call = call_of(request)
        if call is not None:
            server.record_request(call, error.status)
        return _error_response(error)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return fail(request, exc)

    @app.exception_handler(DraftsmanError)
    async def _draftsman_error(request: Request, exc: DraftsmanError) -> JSONResponse:
        return fail(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return fail(request, bad_request("the request body is not valid JSON"))
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: "
            f"{e.get('msg', 'invalid')}" for e in errors[:5])
        return fail(request, ApiError(422, message, code="invalid_type",
                                      param=".".join(loc) or None))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return fail(request, ApiError(exc.status_code, str(exc.detail),
                                      headers=dict(exc.headers or {})))

    @app.get("/health")
    async def health() -> JSONResponse:
        s = server.scheduler
        ok = s.healthy
        return JSONResponse({"status": "ok" if ok else "unavailable",
                             "model": settings.model_name, "waiting": s.waiting,
                             "running": s.running, "capacity": s.capacity},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=server.metrics.content_type)

    def model_card() -> dict[str, Any]:
        return {"id": settings.model_name, "object": "model", "created": server.created,
                "owned_by": "draftsman",
                "draftsman": {"method": settings.method, "options": settings.options,
                              "methods": sorted(METHODS), "drafts": settings.drafts,
                              "context_length": server.context,
                              "max_tokens_cap": settings.max_tokens_cap,
                              "max_prompt_tokens": server.max_prompt_tokens}}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str) -> dict[str, Any]:
        server.check_model(name)
        return model_card()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await generate(body, request, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await generate(body, request, "chat")

    async def generate(body: CompletionRequest | ChatCompletionRequest, request: Request,
                       kind: str) -> Response:
        call = call_of(request)
        assert call is not None
        with server.scheduler.arrival():
            try:
                prepared = await asyncio.to_thread(server.prepare, body, call,
                                                   request.state.scope)
            except Exception as exc:
                return fail(request, exc)
            try:
                job = server.scheduler.submit(prepared.request)
            except ApiError as exc:
                return fail(request, exc)
        meta = dict(kind=kind, rid=new_id(kind), created=now(), model=settings.model_name)
        tally = Tally(started=call.t0)
        if body.stream:
            def on_close() -> None:
                job.cancel()
                server.record_request(call, 200)
                server.record_generation(call, prepared, job, tally)

            return JobStream(stream(job, tally, prepared, meta, body.include_usage()),
                             on_close)
        return await collect(request, call, job, tally, prepared, meta)

    async def collect(request: Request, call: Call, job: Job, tally: Tally,
                      prepared: Prepared, meta: dict[str, Any]) -> Response:
        watcher = asyncio.create_task(_wait_for_disconnect(request, job))
        try:
            async for item in job.items():
                if isinstance(item, Finished):
                    tally.finished = item
                else:
                    tally.add(item)
        finally:
            watcher.cancel()
            job.cancel()
            if tally.finished is None:  # this handler was cancelled (shutdown timeout)
                server.record_request(call, 499)
                server.record_generation(call, prepared, job, tally)
        server.record_generation(call, prepared, job, tally)
        finished = tally.finished
        if finished.error is not None:
            return fail(request, finished.error)
        if tally.cancelled:
            return fail(request, ApiError(499, "the client closed the request",
                                          code="client_closed_request"))
        server.record_request(call, 200)
        return JSONResponse(completion_body(
            **meta, text="".join(tally.text), finish_reason=FINISH_REASONS.get(
                tally.finish or "length", "stop"),
            usage_=usage(len(prepared.request.prompt_ids), tally.tokens),
            stats=tally.stats(prepared.method, prepared.options)))

    async def stream(job: Job, tally: Tally, prepared: Prepared, meta: dict[str, Any],
                     include_usage: bool) -> AsyncIterator[str]:
        if meta["kind"] == "chat":
            yield sse(chunk_body(**meta, role=True))
        async for item in job.items():
            if isinstance(item, Finished):
                tally.finished = item
            else:
                tally.add(item)
                if item.text:
                    yield sse(chunk_body(**meta, text=item.text))
        finished = tally.finished
        assert finished is not None
        if finished.error is not None or tally.cancelled:
            error = (as_api_error(finished.error) if finished.error is not None else
                     ApiError(503, "generation cancelled: the server is shutting down",
                              code="cancelled"))
            yield sse(error_body(error.status, error.message, code=error.code))
            yield sse("[DONE]")
            return
        stats = tally.stats(prepared.method, prepared.options)
        yield sse(chunk_body(**meta, finish_reason=FINISH_REASONS.get(tally.finish or "length",
                                                                      "stop"),
                             extra={"draftsman": stats}))
        if include_usage:
            yield sse(usage_chunk(**meta, usage_=usage(len(prepared.request.prompt_ids),
                                                       tally.tokens), stats=stats))
        yield sse("[DONE]")

    return app
