"""One client connection's protocol state, without sockets: dpproxy's PostgreSQL backend.

    machine   Session: startup, authentication, simple query, running one statement, transactions
    commands  SET, RESET, SHOW, DISCARD, DEALLOCATE and SELECT set_config(…)
    portals   the extended query protocol (Parse/Bind/Describe/Execute/Close) and cursors
    records   the session's records: phase, transaction status, Outcome, prepared statements, portals
    shared    EngineCatalogAuth: what all sessions of one server share (engine, catalog, authenticator)

The settings themselves (names, defaults, checks, transaction semantics) are dpproxy/wire/settings.py.
"""

from dpproxy.wire.session.machine import Session
from dpproxy.wire.session.records import Outcome, Phase, TransactionStatus
from dpproxy.wire.session.shared import EngineCatalogAuth, RunBlocking

__all__ = ["EngineCatalogAuth", "Outcome", "Phase", "RunBlocking", "Session", "TransactionStatus"]
