"""Streamed answers (dpproxy.release.stream): a private answer released batch by batch, in canonical
key order, as the backend returns its rows — never held whole.

The cost is reserved before the first row (a refusal is raised then, before anything runs). The
backend sorts the main statement's rows by the group keys' canonical order (`ordered_sql`) and each
batch is released as a whole answer would be: the rows sent are those, in the order, a whole release
would send. The charge follows the one rule (dpproxy.engine.charge): it stands once the statement was
sent, whatever happens next (a client that goes away mid-answer, a cancel, a failure); a stream
closed before it started releases it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from dpproxy.audit import StatementRecord
from dpproxy.backends import STREAM_BATCH_ROWS, Cancellation
from dpproxy.engine.collector import gc_paused
from dpproxy.engine.plan import Plan, answer_columns
from dpproxy.engine.protocol import EngineLike
from dpproxy.errors import InvalidParameter
from dpproxy.policy import AnalystPolicy
from dpproxy.release.bounds import fixed_bounds_notes
from dpproxy.release.groups import hidden_groups_notes
from dpproxy.release.stream import StreamedRelease, StreamOrderError
from dpproxy.results import Result, ResultStream, encode_result, rows_without_person_notes
from dpproxy.sql.rewrite.state import key_column
from dpproxy.sql.types import PgType

log = logging.getLogger("dpproxy.engine")


def stream_plan(
    engine: EngineLike,
    plan: Plan,
    analyst: AnalystPolicy,
    cancel: Cancellation | None,
    replay: str | None,
    record: StatementRecord | None = None,
) -> ResultStream:
    """Reserve the plan's cost now and return its answer as batches released while the backend's rows
    arrive; `replay`: the key to store the whole answer under for free replay (if it stays small)."""
    if plan.query.subquery_placeholders:
        raise InvalidParameter("internal: a plan whose subqueries hold placeholders cannot be run")
    charge = engine.charge(analyst, plan.cost, plan.query.text, record)
    backend = engine.backend_or_fail()
    result: ResultStream

    def count_rows() -> None:
        if record is not None:
            record.rows = result.rows

    def timed(stage: str, since: float) -> float:
        now = time.perf_counter()
        if record is not None:
            record.add_stage(stage, now - since)
        return now

    def closed_unstarted() -> None:
        count_rows()
        charge.abandon(sent=False)

    def batches() -> Iterator[list[tuple[object, ...]]]:
        release = StreamedRelease(plan.query, plan.noise)
        stored: list[tuple[object, ...]] | None = [] if replay is not None else None
        pending: list[tuple[object, ...]] = []
        source = backend.stream(ordered_sql(plan, backend.dialect), cancel=cancel)
        try:
            clock = time.perf_counter()
            for rows in source:
                charge.sent()
                clock = timed("backend", clock)
                with gc_paused():
                    out = release.release(rows)
                clock = timed("noise", clock)
                if stored is not None:
                    stored.extend(out)
                    if len(stored) > engine.REPLAY_MAX_ROWS:
                        stored = None
                pending.extend(out)
                # Sent in batches of a fixed number of released rows, never at a backend batch's
                # end: a batch ends after STREAM_BATCH_ROWS groups, hidden ones included, so where
                # the client sees a pause in the rows would count the groups partition selection hid.
                while len(pending) >= STREAM_BATCH_ROWS:
                    yield pending[:STREAM_BATCH_ROWS]
                    del pending[:STREAM_BATCH_ROWS]
                    clock = time.perf_counter()
                if release.done:  # LIMIT met: the rest of the answer is never read
                    break
            if pending:
                yield pending
        except GeneratorExit:
            count_rows()
            charge.abandon(sent=True)  # asked for at least once: the statement was sent
            raise
        except StreamOrderError as error:
            count_rows()
            log.error("a streamed answer was refused: the backend did not return groups in key order")
            raise charge.fail(error) from None
        except BaseException as error:
            count_rows()
            raise charge.fail(error) from None
        finally:
            source.close()
        columns = answer_columns(plan, release.errors())
        notes = (
            *fixed_bounds_notes(plan.query),
            *hidden_groups_notes(plan.query, plan.noise, release.groups),
            *rows_without_person_notes(plan.query.relation, engine.unit_not_null),
        )
        count_rows()
        summary = charge.commit(Result(columns, [], notes=notes), plan.cost)
        if stored is not None and replay is not None:
            stored_answer = encode_result(Result(columns, stored, notes=notes))
            engine.ledger.replay_put(analyst.name, replay, stored_answer)  # type: ignore[union-attr]
        result.summary = summary

    unknown: list[float | str | None] = [None] * len(plan.query.aggregates)
    result = ResultStream(answer_columns(plan, unknown), batches(), closed_unstarted)
    return result


def ordered_sql(plan: Plan, dialect: str) -> str:
    """The main statement with its rows sorted in the canonical order of their group keys
    (docs/privacy.md §6): each key ascending, NULLs last, text by bytes (COLLATE "C"; Spark's strings
    compare by bytes), numbers by value, which release.stream checks row by row."""
    quote = "`" if dialect == "spark" else '"'
    text_collation = "" if dialect == "spark" else ' COLLATE "C"'
    order = []
    for j, key in enumerate(plan.query.keys):
        collation = text_collation if key.type in (PgType.TEXT, PgType.VARCHAR) else ""
        order.append(f"{quote}{key_column(j)}{quote}{collation} ASC NULLS LAST")
    return f"SELECT * FROM ({plan.sql}) AS {quote}__streamed{quote} ORDER BY {', '.join(order)}"
