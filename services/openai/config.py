"""OpenAI-compatible front configuration (defaults < TOML file < NEXUS_OPENAI_* env < flags)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import ConfigError, MiB, TransportSecurity
from services.common.serve import ExtraArg


@dataclass(frozen=True)
class OpenAIConfig(TransportSecurity):
    """The HTTP front's settings. The inherited transport fields apply to its HTTP port: ``tls_cert`` + ``tls_key``
    serve HTTPS, ``tls_client_ca`` requires client certificates, ``auth_token`` / ``auth_token_file`` require
    ``Authorization: Bearer <token>`` on every /v1 call (what the ``openai`` client sends as its ``api_key``)."""

    # address the HTTP server binds
    host: str = "127.0.0.1"
    # HTTP port (0 = a free port, logged)
    port: int = 8000
    # seconds in-flight requests get to finish after SIGTERM
    grace_s: float = 5.0
    # the router's gRPC address (RegisterTools, ListTools, Route)
    router_addr: str = "127.0.0.1:50051"
    # the engine's gRPC address (Generate)
    engine_addr: str = "127.0.0.1:50053"
    # a secured router / engine: the CA to trust (turns TLS on towards them)
    backend_tls_ca: str = ""
    # client certificate towards them (mTLS), with backend_tls_key
    backend_tls_cert: str = ""
    # client key towards them (mTLS)
    backend_tls_key: str = ""
    # bearer token the front sends them
    backend_auth_token: str = ""
    # file holding that token (read at start)
    backend_auth_token_file: str = ""
    # The model id clients name in `model` and GET /v1/models lists; any other id is answered 404.
    model_name: str = "nexus"
    # largest request body (larger: 400 with an OpenAI error body)
    max_body_bytes: int = 16 * MiB
    # most messages in one request (more: 400)
    max_messages: int = 1000
    # most tools in one request (more: 400)
    max_tools: int = 1000
    # A request's max_tokens / max_completion_tokens above this is lowered to it (the engine's max_tokens_limit:
    # agent frameworks send generous bounds, and a call's arguments rarely need more than a few hundred tokens).
    max_tokens_limit: int = 2048
    # Requests in flight at once; more are refused 429 at once rather than queued behind the engine's one turn lock.
    max_concurrent: int = 64
    # With tool_choice "auto", a request whose routed tool scores below this is answered in text (no tool fits); 0 =
    # off, every user turn calls a tool. Off by default: on requests for tools that are not registered the router's
    # score tells them apart poorly (AUC 0.74): the threshold that sends 2 % of fitting MetaTool requests to text
    # (0.245) catches 7.5 % of non-fitting ones, on the shipped tools 1.4 % and 7.6 % (bench/no_tool_fits.py;
    # reports/no_tool_fits.json has the curve to choose from).
    min_tool_score: float = 0.0
    # deadline of one Route (and ListTools) call
    route_timeout_s: float = 30.0
    # deadline of one RegisterTools call (the request's new tools: their routing artifacts, signature and grammar;
    # their KV blocks compile in the background)
    register_timeout_s: float = 600.0
    # deadline of one Generate call
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


# The front's own flags beside ``--config`` / ``--host`` / ``--port`` (``python -m services.openai``, ``nexus serve``).
SERVE_ARGS = (
    ExtraArg("--router", "router_addr", "router gRPC address (openai; default 127.0.0.1:50051)"),
    ExtraArg("--engine", "engine_addr", "engine gRPC address (openai; default 127.0.0.1:50053)"),
    ExtraArg("--model", "model_name", "model id clients send (openai; default nexus)"),
)
