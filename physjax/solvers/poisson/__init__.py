"""Poisson and variable-coefficient elliptic solvers: spectral, multigrid, multigrid-CG."""

from ._operator import (
    BOUNDARY_CONDITIONS as BOUNDARY_CONDITIONS,
    fold_boundary_values as fold_boundary_values,
)
from ._solver import (
    METHODS as METHODS,
    PoissonSolution as PoissonSolution,
    PoissonSolver as PoissonSolver,
    solve as solve,
)
from ._transforms import dct2 as dct2, dst2 as dst2, idct2 as idct2, idst2 as idst2
