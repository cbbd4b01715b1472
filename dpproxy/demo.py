"""The demo dataset: generated patients, their hospital visits, and a public table of zip codes.

This module owns the demo schema (`patients`, `visits`, `zip_info`: the demo policy and the SQL
engine rely on these exact names and types), its generation inside DuckDB, and copying it into a
PostgreSQL database or a Spark database. It is trusted operator code: it opens DuckDB without the
backend's lock-down.

Generation is SQL inside DuckDB, in chunks of persons so progress can be reported. Random draws are
hashes of (row id, draw number, seed) instead of random(): hashes give the same data for the same
seed however DuckDB splits the work between threads, and DuckDB's random() does not.

The data is made to make differential privacy visible: skewed counts, a heavy tail of visits per
patient, incomes and costs with extreme outliers that clipping must bound, and NULLs.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class DemoColumn:
    name: str
    duckdb_type: str
    postgres_type: str


@dataclass(frozen=True)
class DemoTable:
    name: str
    columns: tuple[DemoColumn, ...]
    primary_key: str
    # (column, referenced table): declared after the rows are in, where that is faster.
    foreign_keys: tuple[tuple[str, str], ...] = ()

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


ZIP_INFO = DemoTable(
    "zip_info",
    (
        DemoColumn("zip", "VARCHAR", "varchar"),
        DemoColumn("city", "VARCHAR", "varchar"),
        DemoColumn("state", "VARCHAR", "varchar"),
        DemoColumn("population", "INTEGER", "integer"),
    ),
    primary_key="zip",
)
PATIENTS = DemoTable(
    "patients",
    (
        DemoColumn("patient_id", "INTEGER", "integer"),
        DemoColumn("age", "INTEGER", "integer"),
        DemoColumn("sex", "VARCHAR", "varchar"),
        DemoColumn("income", "DECIMAL(12,2)", "numeric(12,2)"),
        DemoColumn("zip", "VARCHAR", "varchar"),
        DemoColumn("diagnosis", "VARCHAR", "varchar"),
        DemoColumn("smoker", "BOOLEAN", "boolean"),
        DemoColumn("enrolled", "DATE", "date"),
    ),
    primary_key="patient_id",
    foreign_keys=(("zip", "zip_info"),),
)
VISITS = DemoTable(
    "visits",
    (
        DemoColumn("visit_id", "BIGINT", "bigint"),
        DemoColumn("patient_id", "INTEGER", "integer"),
        DemoColumn("visit_date", "DATE", "date"),
        DemoColumn("department", "VARCHAR", "varchar"),
        DemoColumn("cost", "DECIMAL(10,2)", "numeric(10,2)"),
        DemoColumn("duration_minutes", "INTEGER", "integer"),
    ),
    primary_key="visit_id",
    foreign_keys=(("patient_id", "patients"),),
)
# In dependency order: a table's foreign keys point to tables before it.
DEMO_TABLES: tuple[DemoTable, ...] = (ZIP_INFO, PATIENTS, VISITS)

SEXES = ("F", "M", "X")
DIAGNOSES = ("healthy", "flu", "cold", "asthma", "diabetes", "hypertension")
DEPARTMENTS = (
    "cardiology",
    "dermatology",
    "emergency",
    "general",
    "neurology",
    "oncology",
    "orthopedics",
    "pediatrics",
)
ZIP_COUNT = 2000
# fmt: off
_STATES = (
    "AL", "AK", "AZ", "AR", "CA", "CO", "CT", "DE", "FL", "GA", "HI", "ID", "IL", "IN", "IA", "KS", "KY",
    "LA", "ME", "MD", "MA", "MI", "MN", "MS", "MO", "MT", "NE", "NV", "NH", "NJ", "NM", "NY", "NC", "ND",
    "OH", "OK", "OR", "PA", "RI", "SC", "SD", "TN", "TX", "UT", "VT", "VA", "WA", "WV", "WI", "WY",
)
_CITY_STEMS = (
    "Spring", "Oak", "Maple", "Cedar", "River", "Lake", "Hill", "Fair", "Green", "West", "East", "North",
    "South", "Clear", "Pine", "Ash", "Elm", "Red", "Stone", "Bright",
)
_CITY_ENDINGS = (
    "field", "ville", "ton", "wood", "port", "view", "dale", "burg", "ford", "haven", "side", "brook",
)
# fmt: on


@dataclass(frozen=True)
class DemoSummary:
    path: Path
    persons: int
    visits: int
    zips: int
    seconds: float


def _sql_list(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _create_table_sql(table: DemoTable, *, dialect: str, constraints: bool) -> str:
    columns = []
    for column in table.columns:
        column_type = column.duckdb_type if dialect == "duckdb" else column.postgres_type
        columns.append(f"{column.name} {column_type}")
    if constraints:
        columns.append(f"PRIMARY KEY ({table.primary_key})")
        for column_name, referenced in table.foreign_keys:
            target = next(t for t in DEMO_TABLES if t.name == referenced)
            columns.append(f"FOREIGN KEY ({column_name}) REFERENCES {referenced} ({target.primary_key})")
    return f"CREATE TABLE {table.name} ({', '.join(columns)})"


# Uniform draws in (0, 1) and standard normal draws (Box–Muller), keyed by (row id, draw number).
# 53 bits of the 64-bit hash fill a double's mantissa exactly; +0.5 keeps ln() away from 0.
_MACROS = """
CREATE TEMP MACRO u(k, draw) AS ((hash(k, draw, {seed}) >> 11)::DOUBLE + 0.5) / 9007199254740992.0;
CREATE TEMP MACRO n(k, draw) AS sqrt(-2 * ln(u(k, draw))) * cos(2 * pi() * u(k, draw + 1));
"""

# Public and fixed: the same zip codes, cities and populations for every seed. Zip codes are
# distinct (43·i < 90000) and ascending, so neighbouring zips share a state, as real ones do.
_ZIP_INFO_SQL = f"""
INSERT INTO zip_info
SELECT
    (10000 + i * 43 + 1234)::VARCHAR AS zip,
    {_sql_list(_CITY_STEMS)}[1 + (hash(i // 4, 101) % {len(_CITY_STEMS)})::INTEGER]
        || {_sql_list(_CITY_ENDINGS)}[1 + (hash(i // 4, 102) % {len(_CITY_ENDINGS)})::INTEGER] AS city,
    {_sql_list(_STATES)}[1 + (i * {len(_STATES)}) // {ZIP_COUNT}] AS state,
    least(150000, greatest(200,
        round(12000 * exp(1.1 * sqrt(-2 * ln(((hash(i, 103) >> 11)::DOUBLE + 0.5) / 9007199254740992.0))
                               * cos(2 * pi() * ((hash(i, 104) >> 11)::DOUBLE + 0.5) / 9007199254740992.0)))
    ))::INTEGER AS population
FROM range({ZIP_COUNT}) AS t(i)
"""

# Where each zip starts on [0, 1): patients pick a zip with probability proportional to its
# population (lognormal, so a few zips are very popular and many are small).
_ZIP_CDF_SQL = """
CREATE TEMP TABLE zip_cdf AS
SELECT zip,
       (sum(population) OVER (ORDER BY zip ROWS UNBOUNDED PRECEDING) - population)::DOUBLE
           / sum(population) OVER () AS lo
FROM zip_info
"""

# Ages follow a pyramid: flat density to 60, then falling linearly to 0 at 100 (inverse CDF).
_PATIENTS_SQL = """
INSERT INTO patients
WITH draws AS (
    SELECT i AS patient_id,
           u(i, 1) AS ua, u(i, 2) AS us, u(i, 3) AS uz, u(i, 4) AS ud, u(i, 5) AS u_null,
           u(i, 6) AS u_rich, u(i, 7) AS u_pareto, n(i, 8) AS z_income, u(i, 10) AS u_smoke,
           u(i, 11) AS u_enrol
    FROM range($lo, $hi) AS t(i)
), aged AS (
    SELECT *,
           least(100, floor(CASE WHEN ua < 0.75 THEN ua * 80
                                 ELSE 100 - sqrt(1600 - 80 * (ua - 0.75) * 80) END))::INTEGER AS age
    FROM draws
)
SELECT
    a.patient_id::INTEGER,
    a.age,
    CASE WHEN a.us < 0.49 THEN 'F' WHEN a.us < 0.98 THEN 'M' ELSE 'X' END,
    CASE WHEN a.u_null < 0.03 THEN NULL
         -- 0.6 % are very rich (Pareto tail from 500 000): what clipping to policy bounds is for.
         WHEN a.u_rich < 0.006 THEN round(least(50000000, 500000 * pow(a.u_pareto, -1 / 1.5)), 2)
         ELSE round(45000 * exp(0.75 * a.z_income), 2)
    END::DECIMAL(12,2),
    z.zip,
    -- Chronic illness grows with age; colds and flu do not care.
    CASE WHEN a.ud < 0.12 THEN 'flu'
         WHEN a.ud < 0.30 THEN 'cold'
         WHEN a.ud < 0.30 + CASE WHEN a.age < 18 THEN 0.10 ELSE 0.06 END THEN 'asthma'
         WHEN a.ud < 0.36 + a.age * 0.0012 THEN 'diabetes'
         WHEN a.ud < 0.36 + a.age * 0.0042 THEN 'hypertension'
         ELSE 'healthy'
    END,
    a.u_smoke < CASE WHEN a.age < 18 THEN 0.02 ELSE 0.18 END,
    DATE '2015-01-01' + floor(a.u_enrol * 4018)::INTEGER
FROM aged AS a
ASOF JOIN zip_cdf AS z ON a.uz >= z.lo
"""

# Visits per patient: 15 % never come; the others 1 + a lognormal draw (median ~3.5 visits, a tail
# past 50). Mean over everyone ~4. visit_id numbers visits in patient order, from $first_visit_id.
_VISITS_SQL = """
INSERT INTO visits
WITH counts AS (
    SELECT patient_id, age, enrolled,
           CASE WHEN u(patient_id, 20) < 0.15 THEN 0
                ELSE 1 + least(400, floor(exp(0.935 + n(patient_id, 21))))::INTEGER END AS visit_count
    FROM patients
    WHERE patient_id >= $lo AND patient_id < $hi
), numbered AS (
    SELECT *, ($first_visit_id + sum(visit_count) OVER (ORDER BY patient_id ROWS UNBOUNDED PRECEDING)
                - visit_count)::BIGINT AS first_id
    FROM counts
), expanded AS (
    SELECT patient_id, age, greatest(DATE '2020-01-01', enrolled) AS first_day,
           unnest(range(first_id, first_id + visit_count)) AS visit_id
    FROM numbered
    WHERE visit_count > 0
), drawn AS (
    SELECT *, u(visit_id, 31) AS ud FROM expanded
), departed AS (
    SELECT *,
           CASE WHEN age < 18 THEN
                CASE WHEN ud < 0.55 THEN 'pediatrics'
                     WHEN ud < 0.70 THEN 'emergency'
                     WHEN ud < 0.85 THEN 'general'
                     WHEN ud < 0.90 THEN 'dermatology'
                     WHEN ud < 0.95 THEN 'orthopedics'
                     WHEN ud < 0.98 THEN 'neurology'
                     WHEN ud < 0.99 THEN 'cardiology'
                     ELSE 'oncology' END
           ELSE
                CASE WHEN ud < 0.30 THEN 'general'
                     WHEN ud < 0.47 THEN 'emergency'
                     WHEN ud < 0.60 + age * 0.001 THEN 'cardiology'
                     WHEN ud < 0.72 + age * 0.001 THEN 'orthopedics'
                     WHEN ud < 0.82 + age * 0.001 THEN 'dermatology'
                     WHEN ud < 0.90 + age * 0.001 THEN 'neurology'
                     ELSE 'oncology' END
           END AS department
    FROM drawn
)
SELECT
    visit_id::BIGINT,
    patient_id,
    first_day + floor(u(visit_id, 32) * (DATE '2025-12-31' - first_day + 1))::INTEGER,
    department,
    CASE WHEN u(visit_id, 33) < 0.002
         -- Rare catastrophic bills: the outliers a sum over visits must clip.
         THEN round(least(2000000, 20000 * pow(u(visit_id, 34), -1 / 1.2)), 2)
         ELSE round(least(20000, 180 * exp(1.1 * n(visit_id, 35)) * CASE department
                WHEN 'oncology' THEN 5 WHEN 'cardiology' THEN 2.5 WHEN 'emergency' THEN 2
                WHEN 'neurology' THEN 2 WHEN 'orthopedics' THEN 1.8 WHEN 'dermatology' THEN 0.8
                WHEN 'pediatrics' THEN 0.7 ELSE 0.6 END), 2)
    END::DECIMAL(10,2),
    least(600, greatest(5, round(25 * exp(0.6 * n(visit_id, 37)) * CASE department
        WHEN 'emergency' THEN 3 WHEN 'oncology' THEN 2 WHEN 'neurology' THEN 1.5 ELSE 1 END)))::INTEGER
FROM departed
"""


def build_demo(
    path: Path,
    persons: int = 100_000,
    *,
    seed: int | None = 0,
    progress: Progress | None = None,
) -> DemoSummary:
    """Generate the demo database into the DuckDB file `path`, replacing it atomically.

    `seed` None draws a fresh seed. `progress(persons_done, persons)` is called after each chunk.
    """
    if persons < 1:
        raise ValueError("persons must be at least 1")
    started = time.perf_counter()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    seed = secrets.randbits(31) if seed is None else seed
    # Written beside the target, then renamed: readers never see half a database.
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        with duckdb.connect(str(partial)) as conn:
            _generate(conn, persons, seed, progress)
            visits, zips = conn.execute(
                "SELECT (SELECT count(*) FROM visits), (SELECT count(*) FROM zip_info)"
            ).fetchone() or (0, 0)
            conn.execute("CHECKPOINT")
        os.replace(partial, path)
    finally:
        for leftover in (partial, partial.with_name(partial.name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    return DemoSummary(
        path=path, persons=persons, visits=visits, zips=zips, seconds=time.perf_counter() - started
    )


def _generate(conn: duckdb.DuckDBPyConnection, persons: int, seed: int, progress: Progress | None) -> None:
    conn.execute(_MACROS.format(seed=int(seed)))
    for table in DEMO_TABLES:
        conn.execute(_create_table_sql(table, dialect="duckdb", constraints=True))
    conn.execute(_ZIP_INFO_SQL)
    conn.execute(_ZIP_CDF_SQL)
    # ~20 chunks: fine-grained enough for a progress bar, large enough to keep DuckDB parallel.
    chunk = max(10_000, -(-persons // 20))
    first_visit_id = 1
    if progress:
        progress(0, persons)
    for lo in range(1, persons + 1, chunk):
        hi = min(persons + 1, lo + chunk)
        conn.execute(_PATIENTS_SQL, {"lo": lo, "hi": hi})
        conn.execute(_VISITS_SQL, {"lo": lo, "hi": hi, "first_visit_id": first_visit_id})
        (last,) = conn.execute("SELECT coalesce(max(visit_id), 0) FROM visits").fetchone() or (0,)
        first_visit_id = max(first_visit_id, last + 1)
        if progress:
            progress(hi - 1, persons)


def load_into_postgres(duckdb_path: Path, dsn: str, *, progress: Progress | None = None) -> None:
    """Copy the demo tables from a DuckDB file into PostgreSQL (schema public), replacing them.

    Rows travel as CSV through `COPY … FROM STDIN`; keys and foreign keys are added after the rows,
    then the tables are analysed. `progress(rows_done, rows_total)` is called as rows are sent.
    """
    import psycopg  # only the PostgreSQL path needs it

    with tempfile.TemporaryDirectory(prefix="dpproxy-demo-") as tmp:
        exports: list[tuple[DemoTable, Path, int]] = []
        with duckdb.connect(str(duckdb_path), read_only=True) as source:
            for table in DEMO_TABLES:
                csv_path = Path(tmp) / f"{table.name}.csv"
                columns = ", ".join(table.column_names)
                source.execute(
                    f"COPY (SELECT {columns} FROM {table.name}) TO '{csv_path}' (FORMAT csv, HEADER false)"
                )
                (rows,) = source.execute(f"SELECT count(*) FROM {table.name}").fetchone() or (0,)
                exports.append((table, csv_path, rows))
        total = sum(rows for _, _, rows in exports)
        done = 0
        if progress:
            progress(0, total)
        # One transaction: other sessions see the old tables or the new ones, never half of them.
        with psycopg.connect(dsn) as conn:
            names = ", ".join(t.name for t in reversed(DEMO_TABLES))
            conn.execute(f"DROP TABLE IF EXISTS {names} CASCADE")
            for table, csv_path, _rows in exports:
                conn.execute(_create_table_sql(table, dialect="postgres", constraints=False))
                columns = ", ".join(table.column_names)
                with (
                    conn.cursor() as cursor,
                    cursor.copy(f"COPY {table.name} ({columns}) FROM STDIN (FORMAT csv)") as copy,
                    csv_path.open("rb") as csv_file,
                ):
                    while block := csv_file.read(1 << 20):
                        copy.write(block)
                        done += block.count(b"\n")
                        if progress:
                            progress(done, total)
            for table in DEMO_TABLES:
                conn.execute(f"ALTER TABLE {table.name} ADD PRIMARY KEY ({table.primary_key})")
            for table in DEMO_TABLES:
                for column_name, referenced in table.foreign_keys:
                    conn.execute(
                        f"ALTER TABLE {table.name} ADD FOREIGN KEY ({column_name}) REFERENCES {referenced}"
                    )
            conn.execute("CREATE INDEX visits_patient_id ON visits (patient_id)")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"ANALYZE {', '.join(t.name for t in DEMO_TABLES)}")


# Rows per Arrow batch sent to Spark Connect: well under its default 128 MiB message limit.
_SPARK_BATCH_ROWS = 250_000


def load_into_spark(
    duckdb_path: Path, url: str, *, database: str = "demo", progress: Progress | None = None
) -> None:
    """Copy the demo tables from a DuckDB file into the Spark database `database` (created if
    missing), replacing them, through a Spark Connect session at `url`.

    Rows travel as Arrow batches (the client needs no access to the cluster's storage); each table is
    written as a managed table of the session's catalog. Spark keeps no keys: none are declared.
    `progress(rows_done, rows_total)` is called after each batch.
    """
    from dpproxy.backends.spark import connect_session

    if not _SPARK_DATABASE_NAME.fullmatch(database):
        raise ValueError("the Spark database name must be letters, digits and underscores")
    session = connect_session(url)
    try:
        with duckdb.connect(str(duckdb_path), read_only=True) as source:
            counts = {t.name: _count(source, t.name) for t in DEMO_TABLES}
            total, done = sum(counts.values()), 0
            if progress:
                progress(0, total)
            session.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`").collect()
            for table in DEMO_TABLES:
                target = f"`{database}`.`{table.name}`"
                relation = source.sql(
                    f"SELECT {', '.join(table.column_names)} FROM {table.name} ORDER BY {table.primary_key}"
                )
                # DuckDB 2 renamed the relation's fetch_arrow_reader to to_arrow_reader.
                to_reader = getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader
                reader = to_reader(_SPARK_BATCH_ROWS)
                mode = "overwrite"
                for batch in reader:
                    frame = session.createDataFrame(_arrow_table(batch))
                    frame.write.mode(mode).saveAsTable(target)
                    mode = "append"
                    done += batch.num_rows
                    if progress:
                        progress(done, total)
                if mode == "overwrite":  # no rows at all: still create the table, empty
                    session.createDataFrame(_arrow_table(reader.schema.empty_table())).write.mode(
                        "overwrite"
                    ).saveAsTable(target)
    finally:
        session.stop()


_SPARK_DATABASE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _count(conn: duckdb.DuckDBPyConnection, table: str) -> int:
    # fetchall, not fetchone: DuckDB 2 refuses further work while a result is left unfinished.
    ((rows,),) = conn.execute(f"SELECT count(*) FROM {table}").fetchall()
    return int(rows)


def _arrow_table(batch: Any) -> Any:
    """A pyarrow Table of one record batch (pyarrow is imported only on the Spark path)."""
    import pyarrow as pa

    return batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
