import sys

from physjax.cli import main

sys.exit(main(["poisson", *sys.argv[1:]]))
