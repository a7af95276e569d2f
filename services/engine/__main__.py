import sys

from services.common.serve import main
from services.engine.config import EngineConfig
from services.engine.server import run

sys.exit(main("engine", EngineConfig, run))
