import sys

from services.common.serve import main
from services.compiler.config import CompilerConfig
from services.compiler.server import run

sys.exit(main("compiler", CompilerConfig, run))
