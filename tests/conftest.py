"""Test configuration: 4 simulated CPU devices and float64 enabled before jax is imported."""

import os
import signal
import subprocess
import sys

# The suite is dominated by XLA compiling small programs, not by running them. Two settings
# of XLA:CPU cut that compile time; neither changes the HLO, its fusions or the operations:
# - `--xla_backend_optimization_level=0` skips LLVM's optimisation of the kernels. Results
#   differ from the default level by round-off only (measured: 200 steps of
#   barotropic-instability, 64², 3e-15 relative in h in float64; the Poisson solvers
#   4e-16). The default suite took 593 s at level 0 against 875 s at the default level, in
#   the same hour on this project's 2-core VM.
# - `--xla_cpu_use_fusion_emitters=false` emits the fused kernels with XLA's older
#   elemental emitter: half the compile time again (a fixed set of 24 Poisson and
#   shallow-water programs, 4.4-5.6 s -> 2.3-2.6 s; the default suite 842-900 s -> 484 s,
#   2026-12-04). Its kernels may contract a multiply-add where the default ones do not, so
#   two programs that compute the same expression in differently shaped loops (the plain
#   step and the cache-blocked strips) can differ in the last bit; the tests that claim the
#   last bit check it under the package's own settings in a subprocess
#   (tests/test_shallow_water_blocked.py). Used only where this jaxlib's XLA knows the flag
#   (an unknown XLA flag aborts the process, so a child process is asked first).
# The docs' examples, which run longer, keep XLA's defaults (tests/test_docs.py);
# PHYSJAX_TEST_OPTIMIZE=1 runs everything with them.
LEGACY_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_accepts(flag: str) -> bool:
    env = dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu")
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    try:
        return subprocess.run(probe, env=env, capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


_flags = os.environ.get("XLA_FLAGS", "")
FAST_COMPILE = ""
# Set already when this process is an xdist worker: the controller's flags are inherited.
if os.environ.get("PHYSJAX_TEST_OPTIMIZE", "") in ("", "0") and (
    "xla_backend_optimization_level" not in _flags
):
    FAST_COMPILE = "--xla_backend_optimization_level=0"
    if _xla_accepts(LEGACY_EMITTERS):
        FAST_COMPILE += " " + LEGACY_EMITTERS
    # for the tests that start a child process as the package runs, without these flags
    # (the docs' examples, the strips' last bit); xdist workers inherit it
    os.environ["PHYSJAX_TEST_FAST_FLAGS"] = FAST_COMPILE
os.environ["XLA_FLAGS"] = (
    f"{_flags} --xla_force_host_platform_device_count=4 {FAST_COMPILE}".strip()
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The CLI tests call physjax.cli.main in this process; keep the test process on glibc's
# default allocator (tune_cpu_allocator is tested in a subprocess).
os.environ["PHYSJAX_NO_ALLOCATOR_TUNING"] = "1"
# ... and on XLA's default vector width (tune_cpu_codegen is tested in a subprocess too)
os.environ["PHYSJAX_NO_CPU_TUNING"] = "1"

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import contextlib  # noqa: E402
import logging  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def compilations():
    """``with compilations() as seen: ...``: ``seen`` lists the XLA compilations started
    inside the block (from ``jax.log_compiles``)."""

    @contextlib.contextmanager
    def collect():
        seen = []

        class Collect(logging.Handler):
            def emit(self, record):
                message = record.getMessage()
                if message.startswith("Compiling"):
                    seen.append(message)

        handler, logger = Collect(), logging.getLogger("jax")
        logger.addHandler(handler)
        try:
            with jax.log_compiles():
                yield seen
        finally:
            logger.removeHandler(handler)

    return collect


class _FullLog:
    """A stderr that refuses every write, as a log on a full disk or over its quota does."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        raise OSError(28, "No space left on device")

    def isatty(self):
        return False


@pytest.fixture(params=["full-log", "closed-stderr"])
def unwritable_stderr(request):
    """A stderr the command cannot write to, to set as ``sys.stderr``: one refusing every
    write (a log on a full disk, ENOSPC) or none at all (``2>&-``)."""
    return _FullLog() if request.param == "full-log" else None


class _Target:
    pass


def _signal_in_a_callback(signum: int) -> None:
    """Raise ``signum`` from a weakref callback, where Python cannot raise what its handler
    raises (it goes to ``sys.unraisablehook``, as when a signal lands in one of jax's
    callbacks while it compiles)."""
    import weakref

    target = _Target()
    ref = weakref.ref(target, lambda _: signal.raise_signal(signum))
    del target  # the callback runs here; what it raises is unraisable
    assert ref() is None


@pytest.fixture
def signal_in_a_callback():
    """``signal_in_a_callback(signum)``: a signal raised where its handler's exception is
    unraisable (a weakref callback)."""
    return _signal_in_a_callback


@pytest.fixture
def drawn_figures(monkeypatch):
    """The matplotlib figures that physjax's plotting draws, kept open for the test to look
    at (physjax closes each one once its PNG is written), in the order drawn; closed when
    the test ends, so that a worker does not keep them all."""
    import matplotlib.pyplot as plt

    close = plt.close
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    yield figures
    for figure in figures:
        close(figure)
