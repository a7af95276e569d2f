"""EngineService gRPC adapter: runs the blocking generation in a worker thread and streams its events."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from nexus.v1 import engine_pb2, engine_pb2_grpc
from services.common.metrics import Metrics
from services.engine.engine import (
    FIDELITY_ADAPTIVE,
    FIDELITY_EXACT,
    PATH_SPLICE,
    PREFILL_AUTO,
    PREFILL_SPLICE,
    PREFILL_TEXT,
    Engine,
    Result,
    Token,
)
from services.engine.text import TextResult
from services.runtime.prompt import Turn

_PATH_TO_PB = {"text": engine_pb2.PREFILL_PATH_TEXT, PATH_SPLICE: engine_pb2.PREFILL_PATH_SPLICE}
_PREFILL_FROM_PB = {engine_pb2.PREFILL_PATH_UNSPECIFIED: PREFILL_AUTO, engine_pb2.PREFILL_PATH_SPLICE: PREFILL_SPLICE,
                    engine_pb2.PREFILL_PATH_TEXT: PREFILL_TEXT}
_FIDELITY_FROM_PB = {engine_pb2.FIDELITY_UNSPECIFIED: FIDELITY_ADAPTIVE, engine_pb2.FIDELITY_ADAPTIVE: FIDELITY_ADAPTIVE,
                     engine_pb2.FIDELITY_EXACT: FIDELITY_EXACT}
_DONE = object()


def result_to_pb(r: Result) -> engine_pb2.GenerateResult:
    return engine_pb2.GenerateResult(
        tool=r.tool, arguments_json=r.arguments_json,
        timings=engine_pb2.Timings(first_token_ms=r.first_token_ms, first_arg_token_ms=r.first_arg_token_ms,
                                   total_ms=r.total_ms, prefill_ms=r.prefill_ms),
        prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
        path=_PATH_TO_PB.get(r.path, engine_pb2.PREFILL_PATH_UNSPECIFIED), path_reason=r.path_reason,
        schema_valid=r.schema_valid, recompute_fraction=r.recompute_fraction,
        spliced_tokens=r.spliced_tokens, recomputed_tokens=r.recomputed_tokens,
        validation_kl=r.validation_kl, validation_top1=r.validation_top1,
    )


def text_result_to_pb(r: TextResult) -> engine_pb2.GenerateResult:
    """A text answer's summary: ``text`` set, no tool and no arguments."""
    reason = "text answer: the conversation in the model's chat template, no tool"
    if r.dropped_turns:
        reason += f" ({r.dropped_turns} oldest turns left out to fit the context)"
    return engine_pb2.GenerateResult(
        text=r.text, truncated=r.truncated,
        timings=engine_pb2.Timings(first_token_ms=r.first_token_ms, total_ms=r.total_ms, prefill_ms=r.prefill_ms),
        prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens, path=engine_pb2.PREFILL_PATH_TEXT,
        path_reason=reason)


class EngineServicer(engine_pb2_grpc.EngineServiceServicer):
    def __init__(self, engine: Engine, metrics: Metrics | None = None):
        self.engine = engine
        self.metrics = metrics or Metrics("engine")
        # Turns run one at a time anyway (the engine's per-turn lock): one long-lived worker thread, instead of
        # the loop's default pool growing threads (each new thread brings its own malloc arena: RSS steps up)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-turn")

    async def Generate(self, request, context):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        history = [Turn(t.role, t.content) for t in request.history]
        max_tokens = request.max_tokens if request.HasField("max_tokens") else None
        # unknown enum numbers (a newer client) fall back to the defaults
        prefill = _PREFILL_FROM_PB.get(request.prefill, PREFILL_AUTO)
        fidelity = _FIDELITY_FROM_PB.get(request.fidelity, FIDELITY_ADAPTIVE)
        validate = request.validate if request.HasField("validate") else None

        def work() -> None:
            if cancelled.is_set():  # the client left while the request was queued
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)
                return
            try:
                # no tool: a text answer over the conversation (services/engine/text.py)
                events = (self.engine.generate(request.query, request.tool, history, max_tokens, fidelity=fidelity,
                                               prefill=prefill, validate=validate) if request.tool else
                          self.engine.generate_text(request.query, history, max_tokens))
                for ev in events:
                    if request.result_only and isinstance(ev, Token):
                        continue  # the caller wants the result alone
                    loop.call_soon_threadsafe(queue.put_nowait, ev)
                    if cancelled.is_set():  # client went away: stop sampling, free the context
                        break
            except BaseException as e:  # noqa: BLE001 - re-raised in the handler
                loop.call_soon_threadsafe(queue.put_nowait, e)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        worker = loop.run_in_executor(self._executor, work)
        try:
            while True:
                ev = await queue.get()
                if ev is _DONE:
                    break
                if isinstance(ev, BaseException):
                    raise ev
                if isinstance(ev, Token):
                    yield engine_pb2.GenerateResponse(token=ev.text)
                elif isinstance(ev, Result):
                    self.metrics.generate_path.labels(ev.path).inc()
                    self.metrics.kv_model_mismatch.set(1.0 if self.engine.model_mismatch else 0.0)
                    self.metrics.ttft_ms.observe(ev.first_token_ms)
                    self.metrics.first_arg_ms.observe(ev.first_arg_token_ms)
                    if ev.recompute_fraction is not None:
                        self.metrics.recompute_fraction.observe(ev.recompute_fraction / 100.0)
                    if ev.validation_top1 is not None:
                        self.metrics.splice_validations.labels("agree" if ev.validation_top1 else "fallback").inc()
                    yield engine_pb2.GenerateResponse(result=result_to_pb(ev))
                elif isinstance(ev, TextResult):
                    self.metrics.ttft_ms.observe(ev.first_token_ms)
                    yield engine_pb2.GenerateResponse(result=text_result_to_pb(ev))
        finally:
            cancelled.set()
            await worker
