"""Every REST error in one shape: RFC 9457 problem details (`application/problem+json`).

    {"type": "about:blank", "title": "Not Found", "status": 404, "detail": "no diagnosis 'dx-…'"}

`type` is `about:blank` (the title is then the HTTP status phrase, as RFC 9457 §4.2.1 asks); a request
that fails validation (422) adds `errors`, one `{"loc", "msg"}` per problem. The OTLP/HTTP paths are
the one exception: the OTLP specification asks for a google.rpc.Status there.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from google.protobuf import json_format
from google.rpc import status_pb2
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

PROBLEM_JSON = "application/problem+json"
OTLP_PATHS = frozenset({"/v1/logs", "/v1/metrics"})


def problem(
    status: int, detail: str, headers: dict[str, str] | None = None, **extensions: Any
) -> JSONResponse:
    body = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        **extensions,
    }
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def refusal(scope: Scope, status: int, rpc_code: int, message: str, headers: dict[str, str]) -> Response:
    """A refusal before any route ran (auth, listener limits): problem JSON; on the OTLP paths a
    google.rpc.Status in the request's encoding, as the OTLP/HTTP specification asks of every error."""
    if scope["path"] not in OTLP_PATHS:
        return problem(status, message, headers)
    st = status_pb2.Status(code=rpc_code, message=message)
    content_type = next(
        (v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"content-type"), ""
    )
    if "json" in content_type:
        return Response(
            json_format.MessageToJson(st, indent=None),
            status_code=status,
            headers=headers,
            media_type="application/json",
        )
    return Response(
        st.SerializeToString(), status_code=status, headers=headers, media_type="application/x-protobuf"
    )


def install(app: FastAPI) -> None:
    """Answer FastAPI's own errors (validation, unknown route, wrong method) as problem details too."""

    async def invalid(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))} for e in exc.errors()
        ]
        where = ".".join(errors[0]["loc"]) if errors else "request"
        detail = f"{where}: {errors[0]['msg']}" if errors else "the request is not valid"
        return problem(422, detail, errors=errors)

    async def http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return problem(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}) or None)

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
