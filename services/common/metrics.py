"""Prometheus metrics: one registry per service process (no global singleton), served over HTTP.

Servicers (the adapters) record; domain code stays free of metrics. ``metrics_port = 0`` disables the
HTTP endpoint (tests), the registry still counts so tests can read it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger("nexus.metrics")

_MS_BUCKETS = (0.5, 1, 2, 5, 10, 15, 20, 30, 40, 60, 100, 200, 400, 800, 1600, 3200, 6400)


@dataclass
class Metrics:
    service: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.rpc_total = Counter("nexus_rpc_total", "RPCs handled, by method and status code",
                                 ["service", "method", "code"], registry=r)
        self.route_ms = Histogram("nexus_route_latency_ms", "Route latency in ms (embedding included)",
                                  buckets=_MS_BUCKETS, registry=r)
        self.gate_escalations = Counter("nexus_gate_escalations_total",
                                        "Route decisions escalated to the cross-encoder", registry=r)
        self.routes = Counter("nexus_routes_total", "Route decisions", registry=r)
        self.generate_path = Counter("nexus_generate_path_total", "Generations by prefill path (splice = A, text = B)",
                                     ["path"], registry=r)
        self.ttft_ms = Histogram("nexus_ttft_ms", "Time to first token in ms", buckets=_MS_BUCKETS, registry=r)
        self.first_arg_ms = Histogram("nexus_first_arg_token_ms", "Time to first argument token in ms",
                                      buckets=_MS_BUCKETS, registry=r)
        self.recompute_fraction = Histogram("nexus_splice_recompute_fraction",
                                            "Fraction of a spliced block re-decoded (0..1)",
                                            buckets=(0, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0), registry=r)
        self.splice_validations = Counter("nexus_splice_validations_total",
                                          "Sidecar checks of a splice against a text prefill, by outcome",
                                          ["outcome"], registry=r)
        self.compiles = Counter("nexus_compiles_total", "Tools compiled, by whether the store already had them",
                                ["cached"], registry=r)
        self.grammar_fallbacks = Counter("nexus_grammar_fallbacks_total",
                                         "Schemas compiled with the looser fallback grammar", registry=r)
        self.kv_blocks_pending = Gauge("nexus_kv_blocks_pending", "KV blocks queued for background compilation "
                                       "(tools registered with defer_kv_blocks)", registry=r)
        self.kv_model_mismatch = Gauge("nexus_kv_model_mismatch", "1 while the compiler announces KV blocks for "
                                       "another model (or prompt head) than this engine's: none can splice",
                                       registry=r)
        self.derive_pending = Gauge("nexus_derive_pending", "Tools waiting for their derived requests", registry=r)
        self.derived = Counter("nexus_derived_total", "Tools whose derived requests were written, by source "
                               "(generated now, or the shipped data of the default registry)", ["source"], registry=r)

    def serve(self, port: int, host: str = "127.0.0.1") -> int | None:
        """Expose ``/metrics`` on ``port`` (0 = disabled). Returns the port or None."""
        if port <= 0:
            return None
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics endpoint", extra={"port": port})
        self._http = server
        return port

    def close(self) -> None:
        server = getattr(self, "_http", None)
        if server is not None:
            server.shutdown()
            server.server_close()

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        v = self.registry.get_sample_value(name, labels or {})
        return float(v or 0.0)
