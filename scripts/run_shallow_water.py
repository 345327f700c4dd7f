#!/usr/bin/env python
"""Run a shallow-water case: the same as ``physjax shallow-water …``."""

import sys

from physjax.cli import run_command

if __name__ == "__main__":
    run_command(["shallow-water", *sys.argv[1:]])
