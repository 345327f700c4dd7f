"""Device meshes, sharding of grid fields and halo exchange under ``shard_map``."""

from ._halo import exchange_halo as exchange_halo
from ._mesh import (
    decompose as decompose,
)
from ._mesh import (
    error_if as error_if,
)
from ._mesh import (
    field_spec as field_spec,
)
from ._mesh import (
    make_mesh as make_mesh,
)
from ._mesh import (
    place_on_mesh as place_on_mesh,
)
from ._mesh import (
    shard as shard,
)
from ._mesh import (
    shard_map_fields as shard_map_fields,
)
