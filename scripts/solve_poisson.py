import sys

from physjax.cli import run_command

run_command(["poisson", *sys.argv[1:]])
