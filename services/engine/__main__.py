import sys

from services.cli import main

sys.exit(main(["serve", "engine", *sys.argv[1:]]))
