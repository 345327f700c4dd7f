"""The Python examples in README.md and docs/*.md run as written.

Each ```python block is run by a fresh interpreter, as a user pasting it would (the pages
that need a file first get one from the command line). A block that stops running — a
renamed function, a changed signature, a wrong claim about what it returns — fails here.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    for page in PAGES:
        for k, match in enumerate(_BLOCK.finditer(page.read_text())):
            yield pytest.param(page, match.group(1), id=f"{page.name}-{k}")


BLOCKS = list(_blocks())


def _run(code, cwd, timeout=600):
    # As a user's fresh interpreter runs them: one CPU device (the suite's simulated four
    # are dropped, so `make_mesh(len(jax.devices()))` is a mesh of one) and XLA's default
    # optimisation and kernel emitters (conftest.py changes both for the rest of the suite;
    # the README's example ran 7x longer at level 0). Simulated devices are not kept even at
    # two: beside the other test worker on a 2-core machine the README's 2000 sharded steps
    # on two of them took 390-430 s instead of 4-7 s alone, 1.1 cores busy the whole time
    # with the main thread in the run's compiled call (the devices' collectives meet between
    # threads).
    # Sharded runs equal to one device are tested in test_shallow_water.py and
    # test_poisson.py.
    flags = os.environ.get("XLA_FLAGS", "")
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags)
    for fast in os.environ.get("PHYSJAX_TEST_FAST_FLAGS", "").split():
        flags = flags.replace(fast, "")
    flags = " ".join(flags.split())
    env = dict(os.environ, MPLBACKEND="Agg", XLA_FLAGS=flags)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_every_page_with_examples_is_collected():
    """The block pattern finds the examples (a test that found none would pass vacuously)."""
    names = {p.values[0].name for p in BLOCKS}
    assert {"README.md", "shallow_water.md", "poisson.md", "gradients.md", "output.md"} <= names
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("page, code", BLOCKS)
def test_example_runs(page, code, tmp_path):
    if "sw.h5" in code:  # the output page reads the quick start's file
        made = _run(
            "from physjax.cli import main; main(['shallow-water', '--nx', '16', '--ny', '16',"
            " '--t-end', '3600', '--output', 'sw.h5'])",
            tmp_path,
        )
        assert made.returncode == 0, made.stderr[-2000:]
    done = _run(code, tmp_path)
    assert done.returncode == 0, f"{page.name} example failed:\n{code}\n{done.stderr[-3000:]}"
    if page.name == "README.md":
        # the example prints its frame times and the mass ratio (conserved to round-off)
        *_, ratio = done.stdout.split()
        assert abs(float(ratio) - 1.0) <= 1e-6, done.stdout
