"""API keys: which requests may use the server, and whose history a request drafts from.

With keys configured, every `/v1/*` request needs `Authorization: Bearer KEY` with one of
them (as vLLM protects /v1 and leaves /health and /metrics open); a missing or wrong key is
answered 401. Keys are compared in constant time. A request's history scope is derived from
its key (a short hash, so the store and the logs never hold a key); without keys every
request shares one anonymous scope.
"""

from __future__ import annotations

import hashlib
import hmac

from draftsman.server.schemas import ApiError

ANONYMOUS = "anonymous"
PROTECTED_PREFIX = "/v1/"


def scope_of(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


class ApiKeys:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [k.encode() for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def protects(self, path: str) -> bool:
        return self.enabled and (path + "/").startswith(PROTECTED_PREFIX)

    def scope(self, authorization: str | None) -> str:
        """The history scope of a request with this Authorization header, or ApiError 401."""
        if not self.enabled:
            return ANONYMOUS
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise _unauthorized("missing API key: send 'Authorization: Bearer KEY'")
        given_bytes = given.strip().encode()
        # compare with every key, always, so timing says nothing about which one (if any)
        matched = [hmac.compare_digest(given_bytes, k) for k in self._keys]
        if not any(matched):
            raise _unauthorized("incorrect API key")
        return scope_of(given.strip())


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})
