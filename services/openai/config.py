"""OpenAI-compatible front configuration (defaults < TOML file < NEXUS_OPENAI_* env < flags)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import ConfigError, MiB, TransportSecurity


@dataclass(frozen=True)
class OpenAIConfig(TransportSecurity):
    """The HTTP front's settings. The inherited transport fields apply to its HTTP port: ``tls_cert`` + ``tls_key``
    serve HTTPS, ``tls_client_ca`` requires client certificates, ``auth_token`` / ``auth_token_file`` require
    ``Authorization: Bearer <token>`` on every /v1 call (what the ``openai`` client sends as its ``api_key``)."""

    host: str = "127.0.0.1"
    port: int = 8000
    # seconds in-flight requests get to finish after SIGTERM
    grace_s: float = 5.0
    # The Nexus services the front calls (gRPC addresses).
    router_addr: str = "127.0.0.1:50051"
    engine_addr: str = "127.0.0.1:50053"
    # How the front reaches secured router / engine: CA to trust (turns TLS on), client cert + key (mTLS), token.
    backend_tls_ca: str = ""
    backend_tls_cert: str = ""
    backend_tls_key: str = ""
    backend_auth_token: str = ""
    backend_auth_token_file: str = ""
    # The model id clients name in `model` and GET /v1/models lists; any other id is answered 404.
    model_name: str = "nexus"
    # Limits of one request (larger: 413 / 400 with an OpenAI error body).
    max_body_bytes: int = 16 * MiB
    max_messages: int = 1000
    max_tools: int = 1000
    # A request's max_tokens / max_completion_tokens above this is lowered to it (the engine's max_tokens_limit:
    # agent frameworks send generous bounds, and a call's arguments rarely need more than a few hundred tokens).
    max_tokens_limit: int = 2048
    # Requests in flight at once; more are refused 429 at once rather than queued behind the engine's one turn lock.
    max_concurrent: int = 64
    # Per-call deadlines towards the services. Registering new tools compiles them first, hence the long one.
    route_timeout_s: float = 30.0
    register_timeout_s: float = 600.0
    generate_timeout_s: float = 120.0
    # How long start-up waits for the router and engine to report SERVING before the front serves anyway (its
    # /health stays 503 until they do).
    backend_wait_s: float = 120.0
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if not self.model_name.strip():
            raise ConfigError("model_name must not be empty")
        for name in ("max_body_bytes", "max_messages", "max_tools", "max_concurrent", "max_tokens_limit"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
