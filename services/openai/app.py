"""The HTTP adapter: OpenAI's /v1/chat/completions and /v1/models over ``ChatService``, and /health.

Thin, like the gRPC servicers: body in -> ``protocol.parse_body`` -> ``ChatService`` -> ``protocol`` builders
-> JSON or server-sent events. Every error leaves as OpenAI's error body ``{"error": {message, type, param, code}}``
with the status its ``NexusError`` class maps to (``HTTP_STATUS``): a caller's mistake is a 4xx, never a 500."""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from services.common.errors import NexusError
from services.openai import protocol
from services.openai.chat import ChatService
from services.openai.config import OpenAIConfig
from services.openai.protocol import Answer, ChatRequest

log = logging.getLogger("nexus.openai")

# gRPC status of a NexusError -> (HTTP status, OpenAI error type). Errors the services return for what the request
# asked (a prompt over the engine's context, a tool JSON over the size limit) are the caller's: 400. A service
# that is down, or refuses for a reason the caller cannot fix, is 503 (the openai client retries those).
HTTP_STATUS: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (400, "invalid_request_error"),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (503, "server_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "server_error"),
    grpc.StatusCode.DATA_LOSS: (503, "server_error"),
}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def error_response(status: int, message: str, type_: str, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(protocol.error_body(message, type_, param, code), status_code=status, headers=headers)


def nexus_error_response(e: NexusError) -> JSONResponse:
    status, type_ = HTTP_STATUS.get(e.code, (500, "server_error"))
    param = protocol.param_of(e)
    code = ("model_not_found" if param == "model" and status == 404 else
            "invalid_api_key" if status == 401 else e.code.name.lower())
    if status >= 500:
        log.warning("request failed", extra={"status": status, "error": e.message})
    return error_response(status, e.message, type_, param, code)


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class Concurrency:
    """At most ``limit`` requests in flight; one over is refused at once (429) rather than queued."""

    def __init__(self, limit: int):
        self.limit, self.active = limit, 0

    def acquire(self) -> bool:
        if self.active >= self.limit:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        self.active -= 1


def create_app(config: OpenAIConfig, service: ChatService, *, token: str | None,
               health: Callable[[], Awaitable[dict[str, str]]], serving: Callable[[], bool]) -> FastAPI:
    """The ASGI app. ``token``: the bearer token /v1 requires (None: open); ``health``: the services' status;
    ``serving``: whether start-up finished."""
    app = FastAPI(title="Nexus OpenAI-compatible front", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())
    slots = Concurrency(config.max_concurrent)
    expected = token.encode() if token else None

    def unauthorized(request: Request) -> JSONResponse | None:
        if expected is None:
            return None
        scheme, _, got = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(got.strip().encode(), expected):
            return None
        msg = "missing bearer token" if not got else "invalid bearer token"
        return error_response(401, f"{msg}: send Authorization: Bearer <token> (the client's api_key)",
                              "invalid_request_error", None, "invalid_api_key",
                              headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", type_,
                              code=str(exc.status_code))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", extra={"path": request.url.path})
        return error_response(500, f"internal error ({type(exc).__name__}); see the server's log", "server_error")

    @app.get("/health")
    async def get_health() -> JSONResponse:
        status = await health()
        ok = serving() and all(v == "SERVING" for v in status.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "starting": not serving(), **status},
                            status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        if (refused := unauthorized(request)) is not None:
            return refused
        return JSONResponse(protocol.models_list(config.model_name, created))

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> JSONResponse:
        if (refused := unauthorized(request)) is not None:
            return refused
        if model != config.model_name:
            return error_response(404, f"the model {model!r} does not exist; this server serves "
                                       f"{config.model_name!r}", "invalid_request_error", "model", "model_not_found")
        return JSONResponse(protocol.model_card(config.model_name, created))

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > config.max_body_bytes:
            raise protocol.invalid(None, f"the request body is {declared} bytes; the limit is {config.max_body_bytes}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > config.max_body_bytes:
                raise protocol.invalid(None, f"the request body exceeds {config.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        if (refused := unauthorized(request)) is not None:
            return refused
        if not slots.acquire():
            return error_response(429, f"the server is saturated ({config.max_concurrent} requests in flight); "
                                       "retry", "rate_limit_error", code="saturated", headers={"Retry-After": "1"})
        release = True
        try:
            req = protocol.parse_body(await read_body(request), model_name=config.model_name,
                                         max_messages=config.max_messages, max_tools=config.max_tools)
            turn = await service.prepare(req)
            events = service.events(turn)
            # the first event before any byte is sent: an engine refusal still gets its own status
            first = await anext(events)
            if not req.stream:
                try:
                    answer = first
                    while not isinstance(answer, Answer):
                        answer = await anext(events)
                finally:
                    await events.aclose()
                return JSONResponse(protocol.completion(answer))
            release = False  # the stream releases its slot when it ends
            return StreamingResponse(_stream(req, turn.answer, first, events, slots), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        except NexusError as e:
            return nexus_error_response(e)
        finally:
            if release:
                slots.release()

    return app


async def _stream(req: ChatRequest, head: Answer, first: str | Answer, events: AsyncIterator[str | Answer],
                  slots: Concurrency) -> AsyncIterator[bytes]:
    """OpenAI's chunks: the call's id and name (or the role of a text answer), the arguments (or the text) in pieces,
    the finish, the usage when asked for, then ``data: [DONE]``. An error after the first byte is sent as an
    ``error`` event."""
    try:
        yield sse(protocol.call_start_chunk(head) if head.tool else protocol.text_start_chunk(head))
        ev = first
        while True:
            if isinstance(ev, Answer):
                yield sse(protocol.finish_chunk(ev))
                if req.include_usage:
                    yield sse(protocol.usage_chunk(ev))
                break
            yield sse(protocol.arguments_chunk(head, ev) if head.tool else protocol.text_chunk(head, ev))
            ev = await anext(events)
        yield b"data: [DONE]\n\n"
    except NexusError as e:
        status, type_ = HTTP_STATUS.get(e.code, (500, "server_error"))
        log.warning("stream failed", extra={"status": status, "error": e.message})
        yield sse(protocol.error_body(e.message, type_, protocol.param_of(e), e.code.name.lower()))
    finally:
        slots.release()
        await events.aclose()
