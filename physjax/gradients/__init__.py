"""Differential operators on functions of one point (forward-mode Laplacian, bounded-memory VJP)."""

from ._jet import Jet as Jet
from ._models import MLP as MLP
from ._models import AbstractNeuralField as AbstractNeuralField
from ._models import FourierMLP as FourierMLP
from ._models import ModifiedMLP as ModifiedMLP
from ._operators import advection as advection
from ._operators import divergence as divergence
from ._operators import gradient as gradient
from ._operators import hessian_diagonal as hessian_diagonal
from ._operators import laplacian as laplacian
from ._operators import second_partial as second_partial
from ._operators import time_derivative as time_derivative
from ._operators import vector_laplacian as vector_laplacian
