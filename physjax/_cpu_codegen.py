"""Let XLA:CPU use 512-bit vectors where they pay: AMD processors with AVX-512.

XLA:CPU vectorises for 256-bit registers unless told otherwise
(``--xla_cpu_prefer_vector_width``), a safe choice on Intel processors, some of which lower
their clock when running 512-bit instructions. AMD's AVX-512 (Zen 4 and later) runs at full
clock, and there the physjax shallow-water step was 4–10% faster with 512-bit vectors at
every size from 256² to 2048², float32 and float64 (same-process A/B of the compiled
``advance``, docs/benchmarks.md), with bit-identical fields: the step is elementwise, so
the vector width changes no rounding. Reductions (a mass or energy sum, a norm) may round
differently at the last bit, as between any two machines.

The flag is read when XLA's CPU backend starts, so [`tune_cpu_codegen`][] must run before
the first JAX computation. The ``physjax`` command and the benchmarks call it; library users
may call it first thing, or set ``XLA_FLAGS=--xla_cpu_prefer_vector_width=512`` themselves.
"""

from __future__ import annotations

import os
import platform
import sys

_FLAG = "--xla_cpu_prefer_vector_width"


def wide_vectors_pay(cpuinfo: str) -> bool:
    """Whether the processor described by ``cpuinfo`` (the text of ``/proc/cpuinfo``) is an
    AMD one with AVX-512 (``avx512f``), where 512-bit vectors run at full clock."""
    vendor = flags = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and vendor is None:
            vendor = value.strip()
        elif key == "flags" and flags is None:
            flags = value.split()
    return vendor == "AuthenticAMD" and flags is not None and "avx512f" in flags


def tune_cpu_codegen() -> bool:
    """Ask XLA:CPU for 512-bit vectors on an AMD processor with AVX-512 (Linux, x86-64).

    Call it before the first JAX computation: it adds ``--xla_cpu_prefer_vector_width=512``
    to ``XLA_FLAGS``, which XLA reads when its CPU backend starts. Nothing is changed when
    ``XLA_FLAGS`` already sets a vector width, when ``PHYSJAX_NO_CPU_TUNING`` is set, on
    other processors, or once JAX's backends have started (too late to take effect).

    **Returns:** ``True`` when the flag is in effect for this process (set here or by the
    user before), ``False`` otherwise.
    """
    current = os.environ.get("XLA_FLAGS", "")
    if _FLAG in current:
        return f"{_FLAG}=512" in current
    if os.environ.get("PHYSJAX_NO_CPU_TUNING"):
        return False
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            cpuinfo = fh.read()
    except OSError:
        return False
    if not wide_vectors_pay(cpuinfo):
        return False
    jax_bridge = sys.modules.get("jax._src.xla_bridge")
    if jax_bridge is not None and jax_bridge.backends_are_initialized():
        return False
    os.environ["XLA_FLAGS"] = f"{current} {_FLAG}=512".strip()
    return True
