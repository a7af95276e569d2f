import sys

from services.cli import main

sys.exit(main(["serve", "router", *sys.argv[1:]]))
