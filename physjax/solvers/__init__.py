"""PDE solvers on structured grids and the shared time stepping."""

from . import poisson as poisson
from ._time_stepping import (
    SCHEMES as SCHEMES,
)
from ._time_stepping import (
    advance as advance,
)
from ._time_stepping import (
    integrate as integrate,
)
from ._time_stepping import (
    integrate_diffrax as integrate_diffrax,
)
from ._time_stepping import (
    rk4_step as rk4_step,
)
from ._time_stepping import (
    ssprk3_step as ssprk3_step,
)
from .poisson import PoissonSolver as PoissonSolver
from .shallow_water import (
    ShallowWater as ShallowWater,
)
from .shallow_water import (
    ShallowWaterSolution as ShallowWaterSolution,
)
from .shallow_water import (
    ShallowWaterState as ShallowWaterState,
)
