"""PDE solvers on structured grids and the shared time stepping."""

from ._time_stepping import (
    SCHEMES as SCHEMES,
    advance as advance,
    integrate as integrate,
    integrate_diffrax as integrate_diffrax,
    rk4_step as rk4_step,
    ssprk3_step as ssprk3_step,
)
from .shallow_water import (
    ShallowWater as ShallowWater,
    ShallowWaterSolution as ShallowWaterSolution,
    ShallowWaterState as ShallowWaterState,
)
