"""Poisson and variable-coefficient elliptic solvers: spectral, multigrid, multigrid-CG."""

from ._operator import (
    BOUNDARY_CONDITIONS as BOUNDARY_CONDITIONS,
)
from ._operator import (
    fold_boundary_values as fold_boundary_values,
)
from ._solver import (
    METHODS as METHODS,
)
from ._solver import (
    PoissonSolution as PoissonSolution,
)
from ._solver import (
    PoissonSolver as PoissonSolver,
)
from ._solver import (
    solve as solve,
)
from ._transforms import dct2 as dct2
from ._transforms import dst2 as dst2
from ._transforms import idct2 as idct2
from ._transforms import idst2 as idst2
