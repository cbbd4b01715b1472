"""The engine: one statement from text to a noisy answer (docs/architecture.md §2–3).

    pipeline   Engine: parse, analyse, plan, charge, run, release; the only place that knows all parts
    plan       Plan: a private query's SQL, noise and cost, every statement it sends emitted once
    caches     the plan caches: what the cold path answered for an identical input, nothing re-bound
    charge     the one charge rule (it stands once a statement was sent) and backend failures' wording
    series     series limits: a private top-k, then the main query on its keys, under one charge
    streaming  answers released batch by batch in canonical key order
    collector  Python's garbage collector paused while answers are released

Nothing below the engine imports it; `explain` renders a Plan and never runs one.
"""

from dpproxy.engine.pipeline import Description, Engine, ExposedTable, connect
from dpproxy.engine.plan import Plan

__all__ = ["Description", "Engine", "ExposedTable", "Plan", "connect"]
