"""physjax: differentiable, multi-device PDE solvers and physics-informed networks in JAX."""

__version__ = "0.1.0"
