#!/usr/bin/env python
"""Solve a Poisson / elliptic problem: the same as ``physjax poisson …``."""

import sys

from physjax.cli import run_command

if __name__ == "__main__":
    run_command(["poisson", *sys.argv[1:]])
