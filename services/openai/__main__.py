"""``python -m services.openai [--config FILE] [--host H] [--port P] [--router ADDR] [--engine ADDR] [--model ID]``:
the OpenAI-compatible front (defaults < TOML file < NEXUS_OPENAI_* env < flags), as ``nexus serve openai``."""

import sys

from services.common.serve import main
from services.openai.config import SERVE_ARGS, OpenAIConfig
from services.openai.server import run

sys.exit(main("openai", OpenAIConfig, run, extra_args=SERVE_ARGS))
