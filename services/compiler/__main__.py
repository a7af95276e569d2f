import sys

from services.cli import main

sys.exit(main(["serve", "compiler", *sys.argv[1:]]))
