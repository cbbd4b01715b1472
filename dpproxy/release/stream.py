"""A private answer released batch by batch, for answers too large to hold (millions of groups).

`StreamedRelease` takes the main statement's rows in batches, already in the canonical order of
their group keys (the engine asks the backend to sort them: docs/privacy.md §6), and releases each
batch as `Engine.release` releases a whole answer: partition selection and noise on each group on
its own (both are independent per group, so batches change nothing), then HAVING and the output
columns, then OFFSET/LIMIT counted over the whole answer. Because the rows arrive in canonical
order, the released rows leave in the order `post_process` would put them in; each released key is
checked to come strictly after the one before, and an answer whose backend broke that order fails
(StreamOrderError) instead of releasing rows in an order that depends on the backend.

Only queries whose release is per group qualify (`streamable`): keys chosen by partition selection,
one statement, no ORDER BY over released values, no quantile, MODE or randomized response.
Like the rest of `release/`, nothing here returns a true value: only released rows and the 95%
figures over the groups released so far.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from dpproxy.privacy import QueryNoise
from dpproxy.release.aggregates import column_errors, release_aggregates
from dpproxy.release.exact import exact_groups
from dpproxy.release.groups import choose_groups
from dpproxy.release.post_processing import PostProcessor, canonical_ranks, plain_columns
from dpproxy.release.requests import selectors
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.types import PgType

# Key types whose order PostgreSQL, DuckDB and Spark agree with Python's canonical order on (text is
# compared under COLLATE "C", byte order, which is code-point order; numbers by value): a float key
# (NaN, ±0) or an interval is released whole instead.
STREAMABLE_KEY_TYPES = frozenset(
    {
        PgType.INT2,
        PgType.INT4,
        PgType.INT8,
        PgType.NUMERIC,
        PgType.TEXT,
        PgType.VARCHAR,
        PgType.BOOL,
        PgType.DATE,
        PgType.TIMESTAMP,
        PgType.TIMESTAMPTZ,
    }
)


class StreamOrderError(Exception):
    """The backend's rows were not in canonical key order: the answer is not released."""


def streamable(query: PrivateQuery, statements: int) -> bool:
    """Whether a query's answer can be released batch by batch in the backend's (canonical) order."""
    requests = selectors(query)
    return (
        bool(query.keys)
        and query.needs_selection
        and query.needs_main_statement
        and statements == 1
        and not query.randomized_response
        and not query.histograms
        and not requests.requests
        and query.bounds is None  # chosen bounds need every group's counts first
        and not query.estimate_left_out  # so does the count of the groups not shown
        and not query.post_processing.order_by
        and all(k.type in STREAMABLE_KEY_TYPES for k in query.keys)
    )


class StreamedRelease:
    """Releases one answer batch by batch (see the module docstring); `done` once LIMIT is met."""

    def __init__(self, query: PrivateQuery, noise: QueryNoise) -> None:
        self.query = query
        self.noise = noise
        post = query.post_processing
        self.processor = PostProcessor(
            post, [k.type for k in query.keys], [a.result_type for a in query.aggregates]
        )
        self._skip = post.offset
        self._left = post.limit
        self._last: tuple[tuple[object, ...], ...] | None = None  # the last released key's ranks
        # [aggregate] the largest of the released groups' own 95% errors so far (None: none known)
        self._largest: list[float | None] = [None] * len(query.aggregates)
        self.rows = 0  # rows released so far
        self.groups = 0  # groups released so far (before HAVING, OFFSET and LIMIT)

    @property
    def done(self) -> bool:
        return self._left == 0

    def release(self, rows: Sequence[Sequence[object]]) -> list[tuple[object, ...]]:
        """The released rows of one batch of the main statement's rows (canonical key order)."""
        query = self.query
        groups = choose_groups(query, exact_groups(query, rows), self.noise)
        released = release_aggregates(query, groups, self.noise)
        limited = self.done  # LIMIT 0: no row is shown, no group counted
        if self.processor.emit is not None and released.keys:
            out, used = self._projected(released.keys, released.columns)
        else:
            out, used = self._rows(released.keys, released.aggregates)
        used = 0 if limited else used
        # The figures and the count cover the released groups up to the row that met LIMIT: a
        # prefix of the released groups in key order. Those after it in the batch are not counted,
        # as the batch's end depends on how many groups the backend returned, hidden ones too.
        self.groups += used
        for a, column_errors_ in enumerate(released.error_columns):
            known = [e for e in column_errors_[:used] if e is not None]
            if known and (self._largest[a] is None or max(known) > self._largest[a]):  # type: ignore[operator]
                self._largest[a] = max(known)
        return out

    def _rows(
        self, keys: Sequence[tuple[object, ...]], aggregates: Sequence[Sequence[object]]
    ) -> tuple[list[tuple[object, ...]], int]:
        """The output rows of one batch's released groups, and how many of those groups precede
        or are the row that met LIMIT (all of them when it was not met)."""
        out: list[tuple[object, ...]] = []
        used = len(keys)
        processor = self.processor
        n_aggregates = processor.n_aggregates
        for i, (key, values) in enumerate(zip(keys, aggregates, strict=True)):
            row = processor.released(key, values)
            # The key's ranks, without canonical_key's final tie-break on the text: distinct groups
            # never tie on them, so strictly increasing ranks are strictly increasing keys.
            rank = canonical_ranks(row[n_aggregates:])
            if self._last is not None and not self._last < rank:
                raise StreamOrderError("the backend returned groups out of canonical key order")
            self._last = rank
            if self._left == 0 or not processor.produce(row):
                continue
            if self._skip:
                self._skip -= 1
                continue
            if self._left is not None:
                self._left -= 1
                if self._left == 0:
                    used = i + 1
            out.append(processor.output(row))
        self.rows += len(out)
        return out, used

    def _projected(
        self, keys: Sequence[tuple[object, ...]], columns: Sequence[Sequence[object]]
    ) -> tuple[list[tuple[object, ...]], int]:
        """`release`'s loop a column at a time, when each output is a released column (no HAVING):
        keys as their columns' types, checked strictly increasing in canonical order (by the values
        themselves when `plain_columns`), then OFFSET and LIMIT, then the outputs
        (PostProcessor.emit: the groups are in canonical order already)."""
        processor = self.processor
        key_columns = processor.typed_key_columns(keys)
        typed = list(zip(*key_columns, strict=True))
        if self._last is not None and not self._last < canonical_ranks(typed[0]):
            raise StreamOrderError("the backend returned groups out of canonical key order")
        ordered = typed if plain_columns(key_columns) else [canonical_ranks(key) for key in typed]
        if not all(a < b for a, b in itertools.pairwise(ordered)):
            raise StreamOrderError("the backend returned groups out of canonical key order")
        self._last = canonical_ranks(typed[-1])
        skip = min(self._skip, len(typed))
        self._skip -= skip
        end = len(typed) if self._left is None else min(len(typed), skip + self._left)
        out = processor.emit(key_columns, columns, range(skip, end))
        used = len(typed)
        if self._left is not None:
            self._left -= len(out)
            if self._left == 0:
                used = end
        self.rows += len(out)
        return out, used

    def errors(self) -> list[float | str | None]:
        """The notice's 95% figure per aggregate over the groups released so far."""
        return column_errors(self.query, self.noise, [self._largest])
