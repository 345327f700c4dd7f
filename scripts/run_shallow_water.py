#!/usr/bin/env python
"""Run a shallow-water case: the same as ``physjax shallow-water …``."""

import sys

from physjax.cli import main

if __name__ == "__main__":
    sys.exit(main(["shallow-water", *sys.argv[1:]]))
