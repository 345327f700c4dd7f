"""physjax: differentiable, multi-device PDE solvers and physics-informed networks in JAX."""

__version__ = "0.1.0"

from ._memory import tune_cpu_allocator

__all__ = ["tune_cpu_allocator", "__version__"]
