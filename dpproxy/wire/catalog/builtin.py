"""PostgreSQL 15's built-in catalog, as dumped into data/pg15.json by dump_pg15.py, read once.

Built-in types and functions, catalog relations and their columns, collations, access methods,
settings' descriptions: PostgreSQL's own content, none of it from a user's database. This module
only reads the dump into frozen records; what the shadow makes of them is build.py's business.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).with_name("data")


@dataclass(frozen=True)
class PgColumn:
    name: str
    type_oid: int
    typmod: int
    notnull: bool
    collation: int


@dataclass(frozen=True)
class PgRelation:
    schema: str
    name: str
    oid: int
    relkind: str
    reltype: int
    columns: tuple[PgColumn, ...]


@dataclass(frozen=True)
class PgTypeRow:
    oid: int
    name: str
    namespace: int
    length: int
    byval: bool
    typtype: str
    category: str
    elem: int
    array: int
    basetype: int
    typmod: int
    align: str
    storage: str
    collation: int


@dataclass(frozen=True)
class PgData:
    relations: tuple[PgRelation, ...]
    tables: Mapping[str, tuple[tuple[str, ...], list[list[Any]]]]  # name → (columns, rows)
    types: Mapping[int, PgTypeRow]
    format_type: Mapping[int, tuple[str, str]]  # oid → (format_type(oid, NULL), format_type(oid, -1))
    settings: tuple[tuple[Any, ...], ...]
    keywords: tuple[tuple[Any, ...], ...]
    descriptions: tuple[tuple[int, int, int, str], ...]
    database: Mapping[str, Any]
    namespaces: Mapping[int, str]

    def base_type(self, oid: int) -> int:
        """The type a domain stands for (RowDescription sends base types); other types unchanged."""
        for _ in range(10):
            row = self.types.get(oid)
            if row is None or row.typtype != "d":
                break
            oid = row.basetype
        return oid

    def element(self, oid: int) -> int | None:
        """The element type of an array type (int2vector and oidvector included), else None."""
        if oid in (22, 30):
            return {22: 21, 30: 26}[oid]
        row = self.types.get(oid)
        if row is None or row.elem == 0 or row.length != -1:
            return None
        return row.elem

    def array_of(self, oid: int) -> int | None:
        row = self.types.get(oid)
        return row.array if row is not None and row.array else None


@functools.cache
def load_pg_data() -> PgData:
    raw = json.loads((DATA_DIR / "pg15.json").read_text(encoding="utf-8"))
    relations = tuple(
        PgRelation(
            r["schema"],
            r["name"],
            r["oid"],
            r["relkind"],
            r["reltype"],
            tuple(PgColumn(*c) for c in r["columns"]),
        )
        for r in raw["relations"]
    )
    tables = {name: (tuple(t["columns"]), t["rows"]) for name, t in raw["tables"].items()}
    columns, rows = tables["pg_type"]
    at = {c: i for i, c in enumerate(columns)}
    types = {
        row[at["oid"]]: PgTypeRow(
            oid=row[at["oid"]],
            name=row[at["typname"]],
            namespace=row[at["typnamespace"]],
            length=row[at["typlen"]],
            byval=row[at["typbyval"]],
            typtype=row[at["typtype"]],
            category=row[at["typcategory"]],
            elem=row[at["typelem"]],
            array=row[at["typarray"]],
            basetype=row[at["typbasetype"]],
            typmod=row[at["typtypmod"]],
            align=row[at["typalign"]],
            storage=row[at["typstorage"]],
            collation=row[at["typcollation"]],
        )
        for row in rows
    }
    columns, rows = tables["pg_namespace"]
    namespaces = {row[columns.index("oid")]: row[columns.index("nspname")] for row in rows}
    return PgData(
        relations=relations,
        tables=tables,
        types=types,
        format_type={int(k): (v[0], v[1]) for k, v in raw["format_type"].items()},
        settings=tuple(tuple(s) for s in raw["settings"]),
        keywords=tuple(tuple(k) for k in raw["keywords"]),
        descriptions=tuple((d[0], d[1], d[2], d[3]) for d in raw["descriptions"]),
        database=raw["database"],
        namespaces=namespaces,
    )
