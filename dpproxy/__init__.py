"""dpproxy: differentially private answers to SQL, behind the PostgreSQL wire protocol.

The Python API's entry point is `dpproxy.connect(policy, backend, ledger)` (or `Engine.open`),
which returns an Engine; `Engine.execute(sql, params, analyst=…)` answers one statement.
"""

from dpproxy.engine import Engine, connect
from dpproxy.results import Result

__all__ = ["Engine", "Result", "connect"]
__version__ = "0.1.0"
