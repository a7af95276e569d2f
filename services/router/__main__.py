import sys

from services.common.serve import main
from services.router.config import RouterConfig
from services.router.server import run

sys.exit(main("router", RouterConfig, run))
