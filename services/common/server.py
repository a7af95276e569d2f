"""Shared gRPC server bootstrap: health, reflection, error mapping, graceful shutdown.

Every Nexus service builds its server with ``build_server`` and runs it with ``serve``:
health reports NOT_SERVING until the service's warm-up finished, reflection lets
``grpcurl -plaintext HOST:PORT list`` work, ``ErrorInterceptor`` maps ``NexusError`` to its
status code (an unexpected exception becomes INTERNAL with a request id, logged with its traceback),
and SIGTERM / SIGINT stop the server with a grace period. ``security`` (``services.common.security``)
optionally serves the port over TLS / mTLS and requires a bearer token on every call but health.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from services.common.errors import InvalidArgument, NexusError
from services.common.security import ServerSecurity

log = logging.getLogger("nexus.server")

REQUEST_ID_KEY = "x-request-id"


def request_id(context: grpc.aio.ServicerContext) -> str:
    """The caller's ``x-request-id`` metadata, or a fresh one."""
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY and value:
            return str(value)[:64]
    return uuid.uuid4().hex[:16]


class _Undecodable:
    """Stands in for a request the protobuf runtime could not parse (e.g. invalid UTF-8 in a string field),
    so the call is answered INVALID_ARGUMENT by the interceptor instead of gRPC's bare UNKNOWN."""

    def __init__(self, error: Exception):
        self.error = error


def _lenient(deserializer):
    if deserializer is None:
        return None

    def deserialize(raw: bytes):
        try:
            return deserializer(raw)
        except Exception as e:  # noqa: BLE001 - DecodeError and friends; answered as INVALID_ARGUMENT
            return _Undecodable(e)

    return deserialize


def _check_decoded(request) -> None:
    if isinstance(request, _Undecodable):
        raise InvalidArgument(f"request could not be decoded: {request.error}")


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps ``NexusError`` raised by servicers to its gRPC status; logs every call as one JSON line and
    counts it in ``nexus_rpc_total`` when given the service's ``Metrics``."""

    def __init__(self, metrics=None):
        self.metrics = metrics

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        metrics = self.metrics

        def done(rid: str, t0: float, status: str, detail: str = "") -> None:
            _log_call(method, rid, t0, status, detail)
            if metrics is not None:
                metrics.rpc_total.labels(metrics.service, method.rsplit("/", 1)[-1], status).inc()
        if handler.unary_unary:
            inner_uu = handler.unary_unary

            async def unary_unary(request, context):
                rid, t0 = request_id(context), time.perf_counter()
                try:
                    _check_decoded(request)
                    resp = await inner_uu(request, context)
                    done(rid, t0, "OK")
                    return resp
                except Exception as e:  # noqa: BLE001 - mapped below, never swallowed
                    await _abort(context, rid, t0, e, done)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            inner_us = handler.unary_stream

            async def unary_stream(request, context):
                rid, t0 = request_id(context), time.perf_counter()
                try:
                    _check_decoded(request)
                    async for item in inner_us(request, context):
                        yield item
                    done(rid, t0, "OK")
                except Exception as e:  # noqa: BLE001
                    await _abort(context, rid, t0, e, done)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream,
                request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler


def _log_call(method: str, rid: str, t0: float, status: str, detail: str = "") -> None:
    log.info(
        "rpc",
        extra={"rpc": method, "request_id": rid, "status": status,
               "ms": round((time.perf_counter() - t0) * 1e3, 3), "detail": detail},
    )


async def _abort(context, rid: str, t0: float, e: Exception, done) -> None:
    if isinstance(e, grpc.aio.AbortError):
        raise e
    if isinstance(e, NexusError):
        done(rid, t0, e.code.name, e.message)
        await context.abort(e.code, e.message)
    if isinstance(e, asyncio.CancelledError):
        raise e
    log.exception("unexpected error (request %s)", rid)
    done(rid, t0, "INTERNAL", repr(e))
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error (request id {rid}); see server log")


@dataclass
class Registration:
    """One service to add to a server: the generated ``add_*Servicer_to_server`` and its servicer."""

    add: Callable[[Any, grpc.aio.Server], None]
    servicer: Any
    full_name: str  # e.g. "nexus.v1.RouterService"


def build_server(
    registrations: Sequence[Registration],
    *,
    host: str,
    port: int,
    max_message_bytes: int,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    metrics=None,
    security: ServerSecurity | None = None,
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """Build (not start) an aio server with health + reflection. Returns ``(server, bound_port, health)``.

    Health starts NOT_SERVING for every service; call ``mark_serving`` after warm-up. Requests larger
    than ``max_message_bytes`` are refused by gRPC with RESOURCE_EXHAUSTED before any handler runs."""
    security = security or ServerSecurity()
    credentials = security.server_credentials()
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(interceptors=[ErrorInterceptor(metrics), *security.interceptors(), *interceptors],
                             options=options)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = [r.full_name for r in registrations]
    for r in registrations:
        r.add(r.servicer, server)
    reflection.enable_server_reflection([*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                         reflection.SERVICE_NAME], server)
    if credentials is not None:
        bound = server.add_secure_port(f"{host}:{port}", credentials)
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind {host}:{port}")
    return server, bound, health


async def set_health(health: HealthServicer, names: Sequence[str], serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", *names):
        await health.set(name, status)


async def serve(
    registrations: Sequence[Registration],
    *,
    host: str,
    port: int,
    max_message_bytes: int,
    grace_s: float,
    warmup: Callable[[], Awaitable[None]] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    ready: Callable[[int], None] | None = None,
    stop_event: asyncio.Event | None = None,
    metrics=None,
    metrics_port: int = 0,
    security: ServerSecurity | None = None,
) -> None:
    """Run a server until SIGTERM/SIGINT (or ``stop_event``): bind, start, warm up, mark SERVING,
    then on stop mark NOT_SERVING and ``await server.stop(grace_s)``."""
    server, bound, health = build_server(registrations, host=host, port=port, max_message_bytes=max_message_bytes,
                                         metrics=metrics, security=security)
    if metrics is not None:
        metrics.serve(metrics_port, host=host)
    names = [r.full_name for r in registrations]
    await set_health(health, names, serving=False)
    await server.start()
    sec = security or ServerSecurity()
    log.info("listening", extra={"host": host, "port": bound, "services": names, "tls": sec.tls,
                                 "mtls": bool(sec.tls_client_ca), "auth": bool(sec.token())})
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (RuntimeError, ValueError):  # not the main thread (NotImplemented on some loops is a RuntimeError)
            pass
    try:
        if warmup is not None:
            await warmup()
        await set_health(health, names, serving=True)
        if ready is not None:
            ready(bound)
        log.info("serving", extra={"port": bound})
        await stop.wait()
    finally:
        log.info("stopping", extra={"grace_s": grace_s})
        await set_health(health, names, serving=False)
        await server.stop(grace_s)
        if metrics is not None:
            metrics.close()
        if on_stop is not None:
            await on_stop()
