"""physjax: differentiable, multi-device PDE solvers and physics-informed networks in JAX."""

__version__ = "0.1.0"

from ._cpu_codegen import tune_cpu_codegen
from ._memory import tune_cpu_allocator

__all__ = ["tune_cpu_allocator", "tune_cpu_codegen", "__version__"]
