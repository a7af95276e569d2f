"""Typed Python client of a Nexus cluster: ``from nexus_client import NexusClient``.

Built into a wheel with the generated ``nexus.v1`` stubs by ``make stubs``."""

from nexus_client.client import (
    Candidate,
    CompileResult,
    GenerateResult,
    NexusClient,
    NexusClientError,
    RouteResult,
    tls_credentials,
)

__all__ = ["Candidate", "CompileResult", "GenerateResult", "NexusClient", "NexusClientError", "RouteResult",
           "tls_credentials"]
