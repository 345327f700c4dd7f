"""Shared jaxtyping aliases."""

from jaxtyping import Array, ArrayLike, Float

Scalar = Float[Array, ""]
ScalarLike = float | Float[ArrayLike, ""]
Field2D = Float[Array, "ny nx"]
Field3D = Float[Array, "nz ny nx"]
Field = Float[Array, "*shape"]
Point = Float[Array, " d"]
