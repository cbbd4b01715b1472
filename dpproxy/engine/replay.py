"""A private plan answered for an analyst: a stored answer replayed for free, or the plan streamed,
or run and charged, its answer then stored for replay (`defaults.replay`)."""

from __future__ import annotations

from dpproxy.audit import StatementRecord
from dpproxy.backends import Cancellation
from dpproxy.engine.caches import kept_key
from dpproxy.engine.clipping import clip_parts, run_clipped
from dpproxy.engine.plan import Plan
from dpproxy.engine.protocol import EngineLike
from dpproxy.engine.streaming import stream_plan
from dpproxy.policy import AnalystPolicy
from dpproxy.privacy import Cost
from dpproxy.release.stream import streamable
from dpproxy.results import Result, ResultStream, decode_result, encode_result
from dpproxy.sql.bounds import SessionBounds


def answer_plan(
    engine: EngineLike,
    plan: Plan,
    who: AnalystPolicy,
    cancel: Cancellation | None,
    stream: bool,
    record: StatementRecord,
    bounds: SessionBounds | None = None,
    *,
    clip: bool = False,
) -> Result | ResultStream:
    """A private plan's answer: a stored one replayed, or streamed, or run and charged; with `clip`,
    its averages' value ranges chosen first when it has such (dpproxy.engine.clipping)."""
    replay = replay_key(engine, plan) if engine.policy.defaults.replay and engine.ledger is not None else None
    if replay is not None:
        stored = engine.ledger.replay_get(who.name, replay)  # type: ignore[union-attr]
        if stored is not None:
            replayed = _replayed(engine, stored, who)
            record.replayed = True
            record.cost = Cost.ZERO
            record.rows = len(replayed.rows)
            return replayed
    clipped = clip_parts(engine, plan, bounds) if clip else None
    if clipped is None and stream and streamable(plan.query, len(plan.statements)):
        return stream_plan(engine, plan, who, cancel, replay, record)
    if clipped is not None:
        result = run_clipped(engine, plan, clipped, who, cancel, record)
    else:
        result = engine.run(plan, analyst=who, cancel=cancel, record=record)
    if replay is not None and len(result.rows) <= engine.REPLAY_MAX_ROWS:
        engine.ledger.replay_put(who.name, replay, encode_result(result))  # type: ignore[union-attr]
    return result


def replay_key(engine: EngineLike, plan: Plan) -> str:
    """The policy, the normalised statement (parameters bound), ε, δ, the bounds the session set
    and whether it asked what they leave out (which the statement's text does not show), the
    session's time zone (which casts to timestamptz are folded in) and the operator's data epoch.

    Nothing else, and nothing read from the database: no table statistics, no file times, and no
    call to the backend at all. Whether a repeat is free (a stored answer) or charged (a fresh one)
    is a bit the analyst sees; keyed this way it says only whether this analyst asked this very
    question in this epoch before (and whether its answer was since evicted among their own oldest,
    or forgotten by an operator's reset), which they already know. A key that followed the data
    would say, for free and with certainty, whether a table was written in between (rolled-back
    writes included): in a rarely written table, when one person arrived. The price is that within
    an epoch a repeat gets the answer from before any write; `defaults.data_epoch` says when the
    operator wants new answers.
    """
    asked = (plan.query.text, repr(plan.epsilon), repr(plan.delta), repr(plan.query.bounds))
    if plan.query.estimate_left_out:  # SET dpproxy.estimate_left_out: an answer with its estimates
        asked += ("estimate_left_out",)  # (added only then: keys stored without it stay valid)
    return kept_key(engine.policy_digest, engine.policy.defaults.data_epoch, *asked)


def _replayed(engine: EngineLike, payload: bytes, analyst: AnalystPolicy) -> Result:
    columns, rows, notes = decode_result(payload)
    # The analyst's spending in their current window, and the data set's (Engine.budget).
    status = engine.budget(analyst.name)
    return Result(columns, rows, Cost.ZERO, status, private=True, replayed=True, notes=notes)
