"""Test configuration: 4 simulated CPU devices and float64 enabled before jax is imported."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
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
