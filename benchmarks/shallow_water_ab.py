"""Same-process A/B of shallow-water step variants, interleaved: cost per cell-update.

Each variant is ``N:DTYPE:ROWS:STEPS`` (``ROWS``/``STEPS``: ``strip_rows``/``strip_steps``
of ``ShallowWater``, or ``auto``); every round times each variant for 0.7 s in turn, so
that the VM's slow drifts weigh on all of them alike. Prints best and median ns per
cell-update over the rounds. Example (the before/after table in docs/benchmarks.md):

    python benchmarks/shallow_water_ab.py 256:float64:0:auto 512:float64:0:auto \\
        1024:float64:64:1 2048:float64:32:1 1024:float64:128:3 2048:float64:64:3
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# importing it tunes the allocator and enables x64
from shallow_water import (  # noqa: E402
    DTYPES,
    bandwidth,
    compiled_advance,
    count_fusions,
    interleaved,
    make,
    positive_float,
    positive_int,
)

from physjax.solvers.shallow_water._model import _strip_plan  # noqa: E402


def variant(text: str) -> str:
    """An argparse type: ``N:DTYPE:ROWS:STEPS`` (ROWS and STEPS a count or ``auto``),
    checked before anything is measured."""
    parts = text.split(":")
    ok = len(parts) == 4 and parts[1] in DTYPES
    if ok:
        try:
            positive_int(parts[0])
            if parts[2] != "auto" and int(parts[2]) < 0:
                ok = False
            if parts[3] != "auto":
                positive_int(parts[3])
        except (ValueError, argparse.ArgumentTypeError):
            ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"expected N:DTYPE:ROWS:STEPS, e.g. 256:float32:0:auto (N ≥ 1, DTYPE float32 or "
            f"float64, ROWS ≥ 0 or auto, STEPS ≥ 1 or auto), got {text!r}"
        )
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variants", nargs="+", type=variant, help="N:DTYPE:ROWS:STEPS")
    p.add_argument("--rounds", type=positive_int, default=8)
    p.add_argument("--seconds", type=positive_float, default=0.7)
    p.add_argument(
        "--bandwidth",
        action="store_true",
        help="also measure the copy-like stream a = a + 1 and print each variant's fraction "
        "of it (minimum traffic 18 N² itemsize bytes per RK3 step)",
    )
    p.add_argument(
        "--fusions",
        action="store_true",
        help="also count the kernels of the variants that are plain steps (ROWS 0, or auto where "
        "it does not block)",
    )
    args = p.parse_args(argv)
    copy_gbps = None
    if args.bandwidth:
        import jax

        copy_gbps = bandwidth(0.5 if jax.default_backend() == "cpu" else 2.0)["jax_copy_GBps"]
        print(f"copy-like stream a = a + 1: {copy_gbps:.1f} GB/s")
    fns = {}
    for v in args.variants:
        n, dtype, rows, steps = v.split(":")
        rows = None if rows == "auto" else int(rows)
        steps = None if steps == "auto" else int(steps)
        fns[v] = compiled_advance(int(n), dtype, rows, steps)
    for v, (best, median) in interleaved(fns, args.rounds, args.seconds).items():
        line = f"{v:>24}  best {best:6.2f}  median {median:6.2f} ns per cell-update"
        n, dtype, rows, _ = v.split(":")
        if copy_gbps is not None:
            bytes_per_cell = 18 * np.dtype(dtype).itemsize
            line += f"  {100 * bytes_per_cell / median / copy_gbps:5.1f}% of copy bandwidth"
        if args.fusions and rows in ("0", "auto"):
            model, state, dt = make(int(n), dtype, None if rows == "auto" else int(rows))
            # an automatic variant that blocks into strips (on the CPU, once the fields
            # outgrow the cache) is no plain step: its loop body is the strips'
            if not _strip_plan(model)[0]:
                line += f"  fusions/step {count_fusions(model, state, dt)}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
