"""Test configuration: 4 simulated CPU devices and float64 enabled before jax is imported."""

import os

# The suite is dominated by XLA compiling small programs, not by running them, and most of
# the compiling is LLVM optimising the kernels. Level 0 skips that: the HLO, its fusions and
# the operations are the same, and results differ from the default level by round-off only
# (measured: 200 steps of barotropic-instability, 64², 3e-15 relative in h in float64; the
# Poisson solvers 4e-16). The default suite took 593 s at level 0 against 875 s at the
# default level, in the same hour on this project's 2-core VM. The docs' examples, which
# run longer, keep the default level (tests/test_docs.py); PHYSJAX_TEST_OPTIMIZE=1 runs
# everything at it.
FAST_COMPILE = "--xla_backend_optimization_level=0"
_flags = os.environ.get("XLA_FLAGS", "")
if os.environ.get("PHYSJAX_TEST_OPTIMIZE", "") not in ("", "0") or (
    "xla_backend_optimization_level" in _flags
):
    FAST_COMPILE = ""
os.environ["XLA_FLAGS"] = (
    f"{_flags} --xla_force_host_platform_device_count=4 {FAST_COMPILE}".strip()
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The CLI tests call physjax.cli.main in this process; keep the test process on glibc's
# default allocator (tune_cpu_allocator is tested in a subprocess).
os.environ["PHYSJAX_NO_ALLOCATOR_TUNING"] = "1"

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
