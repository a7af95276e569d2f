"""``python -m services.openai [--config FILE] [--host H] [--port P] [--router ADDR] [--engine ADDR] [--model ID]``:
the OpenAI-compatible front (defaults < TOML file < NEXUS_OPENAI_* env < flags)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.common.config import ConfigError, load_config
from services.common.logging_setup import setup_logging
from services.openai.config import OpenAIConfig
from services.openai.server import run


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.openai",
                                description="Nexus's OpenAI-compatible /v1/chat/completions front")
    p.add_argument("--config", help="TOML file of OpenAIConfig fields")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default 8000; 0 = a free port, logged)")
    p.add_argument("--router", dest="router_addr", help="router gRPC address (default 127.0.0.1:50051)")
    p.add_argument("--engine", dest="engine_addr", help="engine gRPC address (default 127.0.0.1:50053)")
    p.add_argument("--model", dest="model_name", help="model id clients send (default nexus)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    overrides = {k: getattr(args, k) for k in ("host", "port", "router_addr", "engine_addr", "model_name")}
    try:
        config = load_config(OpenAIConfig, prefix="NEXUS_OPENAI_", file=args.config, overrides=overrides)
    except ConfigError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, service="openai")
    asyncio.run(run(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
