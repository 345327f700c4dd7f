"""Shared jaxtyping aliases, and the test for values known before compiling."""

import jax
from jaxtyping import Array, ArrayLike, Float

Scalar = Float[Array, ""]
ScalarLike = float | Float[ArrayLike, ""]
Field2D = Float[Array, "ny nx"]
Field3D = Float[Array, "nz ny nx"]
Field = Float[Array, "*shape"]
Point = Float[Array, " d"]


def is_concrete(x) -> bool:
    """Whether ``x`` has a value now (not a tracer inside ``jit``/``grad``/``vmap``), so that
    an input check can run in Python before anything is compiled."""
    return not isinstance(x, jax.core.Tracer)
