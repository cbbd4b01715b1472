"""Drafting a policy from a live schema (`dpproxy policy init`).

This module owns `draft_policy`: a commented YAML skeleton that loads as-is and is conservative (no
number column summable until the data owner gives bounds, no public value sets, an analyst without a
password), with every guess, such as the privacy unit, marked `# TODO` for the data owner to check.

It must never import a backend or touch data: it works on the column list the caller got from the
backend, and writes text for a person to review, never a `Policy` that is used unreviewed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dpproxy.policy.live_schema import LiveColumnLike
from dpproxy.policy.model import is_valid_name
from dpproxy.policy.types import ColumnType

# Column names that usually identify a person, used only to pre-fill a draft's privacy unit.
_PERSON_ID_NAMES = (
    "person_id", "user_id", "patient_id", "customer_id", "individual_id", "member_id", "employee_id",
    "participant_id", "subject_id", "student_id", "client_id", "account_id", "household_id",
)  # fmt: skip


def draft_policy(live: Mapping[str, Sequence[LiveColumnLike]], *, analyst: str = "analyst") -> str:
    """A commented policy skeleton for the live schema (`dpproxy policy init`).

    The draft loads as-is and is conservative: no number column is summable until the data owner
    gives its bounds, no value set is public, the analyst has no password (so cannot connect over
    the network). Every guess is marked `# TODO` for the data owner to check. Tables and columns
    that cannot be exposed are listed as comments. ValueError if `analyst` is not a valid name.
    """
    shared_ids = _ids_shared_between_tables(live)
    out = [
        "# dpproxy policy drafted from the database schema. Review every TODO before serving:",
        "# a wrong privacy unit, bound or public value set weakens the privacy guarantee.",
        "# Reference: the README (Policy reference). Check with `dpproxy policy check`.",
        "version: 1",
        "",
        "defaults:",
        "  epsilon: 0.5        # per-query epsilon when a query does not ask for another",
        "  delta: 1.0e-7       # per-query delta",
        "  mechanism: laplace",
        "",
        "analysts:",
        f"  # TODO: add `password:` with the output of `dpproxy policy passwd`; without one, {analyst}",
        "  # can use dpproxy only from the command line and the Python API, not over the network.",
        f"  {_draft_name(analyst, 'analyst')}: {{epsilon: 1.0, delta: 1.0e-6}}  # TODO: set the total budget",
        "",
        "tables:",
    ]
    for key in sorted(live):
        schema, _, table_name = key.rpartition(".")
        columns = [c for c in live[key] if c.type is not None and is_valid_name(c.name)]
        skipped = [c for c in live[key] if c not in columns]
        if not is_valid_name(table_name) or (schema and not is_valid_name(schema)):
            out.append(f"  # skipped table {key}: its name is not a lowercase SQL identifier")
            continue
        if not columns:
            out.append(f"  # skipped table {key}: no column of a supported type")
            continue
        out.append(f"  {table_name}:")
        if schema:
            out.append(f"    schema: {schema}")
        unit = _guess_unit(columns, shared_ids)
        if unit is None:
            out.append(
                "    # TODO: `row` says each row is a different person. If one person can have several"
            )
            out.append(
                "    # rows, name the column identifying the person instead, and set max_rows_per_unit."
            )
            out.append(
                "    # If the table holds no personal data at all, replace all this with `public: true`."
            )
            out.append("    privacy_unit: row")
        else:
            out.append(f"    privacy_unit: {unit}  # TODO: check that {unit} identifies one person")
            out.append(
                "    max_groups_per_unit: 1  # TODO: the most groups one person may contribute to per query"
            )
            out.append(
                "    max_rows_per_unit: 1    # TODO: the most rows one person may contribute per group"
            )
        out.append("    columns:")
        width = max(len(c.name) for c in columns) + 1
        for column in columns:
            label = f"{column.name}:".ljust(width)
            assert column.type is not None
            if column.name == unit:
                out.append(f"      {label} {{type: {column.type}}}  # the privacy unit")
            elif column.type.is_number:
                out.append(
                    f"      {label} {{type: {column.type}, summable: false}}"
                    "  # TODO: to allow SUM/AVG, replace summable: false by lower: ..., upper: ..."
                )
            elif column.type.is_text or column.type is ColumnType.BOOLEAN:
                out.append(
                    f"      {label} {{type: {column.type}}}"
                    "  # TODO: if its set of values is public knowledge, add public_values: [...]"
                )
            else:
                out.append(f"      {label} {{type: {column.type}}}")
        for column in skipped:
            reason = "unsupported type " + column.sql_type if column.type is None else "name is not lowercase"
            out.append(f"      # {column.name}: not exposed ({reason})")
    if len(out) and out[-1] == "tables:":
        out.append("  {}  # TODO: no table could be drafted; list the tables analysts may query")
    return "\n".join(out) + "\n"


def _draft_name(name: str, kind: str) -> str:
    if not is_valid_name(name):
        raise ValueError(f"{kind} name `{name}` is not a lowercase SQL identifier")
    return name


def _ids_shared_between_tables(live: Mapping[str, Sequence[LiveColumnLike]]) -> set[str]:
    seen: dict[str, int] = {}
    for columns in live.values():
        for name in {c.name for c in columns if c.name.endswith("_id")}:
            seen[name] = seen.get(name, 0) + 1
    return {name for name, count in seen.items() if count > 1}


def _guess_unit(columns: Sequence[LiveColumnLike], shared_ids: set[str]) -> str | None:
    names = [c.name for c in columns]
    for name in _PERSON_ID_NAMES:
        if name in names:
            return name
    # An id column several tables carry (patients.patient_id, visits.patient_id) is the usual unit.
    for name in names:
        if name in shared_ids:
            return name
    return None
