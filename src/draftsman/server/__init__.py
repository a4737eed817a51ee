"""OpenAI-compatible HTTP server: `create_app(engine, ServerSettings(...))`, run by
`draftsman serve`. See `app.py` for the request life cycle and `worker.py` for the queue."""

from draftsman.server.app import ServerSettings, create_app

__all__ = ["ServerSettings", "create_app"]
