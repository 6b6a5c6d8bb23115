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
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

PROBLEM_JSON = "application/problem+json"


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
