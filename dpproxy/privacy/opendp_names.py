"""OpenDP's names as the package uses them (`dp.m.make_laplace`, `dp.atom_domain`, …), from OpenDP's
own modules: `opendp.prelude` without its extras.

The prelude also imports `opendp.extras` (its scikit-learn, NumPy, Polars and Ibis bindings, and
SciPy behind them), none of which dpproxy uses: about half a second of CPU at the start of every
process that imports dpproxy — each command of the CLI, each server worker (spawned) — and of every
reload. The names here are those of the prelude's modules the package uses (not `accuracy`,
`context` or `core`), so `from dpproxy.privacy import opendp_names as dp` reads like the prelude
OpenDP's documentation uses.
"""

from opendp import combinators as c  # noqa: F401
from opendp import measurements as m  # noqa: F401
from opendp import transformations as t  # noqa: F401
from opendp.domains import *  # noqa: F403
from opendp.measures import *  # noqa: F403
from opendp.metrics import *  # noqa: F403
from opendp.mod import *  # noqa: F403
from opendp.typing import *  # noqa: F403
