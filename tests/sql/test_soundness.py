"""The classes of the soundness review, one test (or more) named after each, on both backends.

The generated-language tests (tests/sql/test_language.py) look for new members of these classes; the
tests here pin the examples the review found, so each fix is visible on its own:
  1. raw protected values reached the backend through SQL over public tables (subqueries);
  2. a protected table on the nullable side of an outer join;
  8. crashes and silent drops in the analyzer (table functions, TABLESAMPLE, ONLY);
  9. accepted queries that could not run;
 10. PostgreSQL and DuckDB disagreeing on accepted row functions.
(Classes 3–7 have their own modules: release/test_canonical_order, budget/test_replay_epoch,
budget/test_charge_stands, release/test_error_bars, backends/test_enforced_unique; the catalog part of
class 8 is in wire/test_catalog.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpproxy.engine import Engine
from dpproxy.errors import DPProxyError
from dpproxy.policy import parse_policy
from dpproxy.sql import subqueries
from tests.certify import at_ceilings, certify
from tests.pgcluster import PgCluster
from tests.sql.language import schema
from tests.sql.language.databases import Loaded, RawBackend, adversarial_pair


@pytest.fixture(scope="module")
def loaded(pg_cluster: PgCluster) -> Iterator[dict[str, Loaded]]:
    """The adversarial database of the language tests, in DuckDB and in PostgreSQL."""
    with adversarial_pair(pg_cluster, "sound") as pair:
        yield pair


def engine(loaded: Loaded, limits: dict[str, tuple[int, int]] = schema.LIMITS) -> Engine:
    return Engine(parse_policy(schema.policy_text(limits)), RawBackend(loaded))


def refused(engine_: Engine, sql: str) -> DPProxyError:
    with pytest.raises(DPProxyError) as caught:
        engine_.plan(sql, salt="s")
    return caught.value


BACKENDS = ["duckdb", "postgres"]

# -- class 1 -------------------------------------------------------------------------------------

# A name the public table lacks binds, in SQL, to the protected row beside the subquery; a partial
# function then fails or not depending on one person's value. Every clause, every subquery kind.
CORRELATED_ATTACKS = [
    "SELECT COUNT(*) FROM patients WHERE zip IN (SELECT zip FROM zip_info WHERE 1 / (income - 12345) > 0)",
    "SELECT COUNT(*) FROM patients WHERE zip IN (SELECT zip FROM zip_info WHERE CAST(income AS smallint) > 0)",
    "SELECT COUNT(*) FROM patients p WHERE EXISTS (SELECT 1 FROM zip_info z WHERE z.zip = p.zip AND p.age = 41)",
    "SELECT COUNT(*) FROM patients WHERE age > (SELECT MAX(population) FROM zip_info WHERE population / (age - 41) > 0)",
    "SELECT zip IN (SELECT zip FROM zip_info WHERE 1 / (age - 41) > 0) AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT COUNT(*), SUM(CASE WHEN zip IN (SELECT zip FROM zip_info WHERE patient_id = 3) THEN 1 ELSE 0 END) FROM patients",
    "SELECT diagnosis, COUNT(*) FROM patients GROUP BY diagnosis HAVING diagnosis IN (SELECT state FROM zip_info WHERE population / (income - 1) > 0)",
    "SELECT diagnosis, COUNT(*) FROM patients GROUP BY diagnosis ORDER BY (SELECT COUNT(*) FROM zip_info WHERE zip = diagnosis)",
    "SELECT COUNT(*) FROM patients p JOIN visits v ON p.patient_id = v.patient_id WHERE v.department IN (SELECT state FROM zip_info WHERE population = v.duration)",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sql", CORRELATED_ATTACKS)
def test_raw_protected_values_never_reach_the_backend_through_public_sql(
    loaded: dict[str, Loaded], backend: str, sql: str
) -> None:
    """Correlated subqueries are refused from the text alone, before any statement is run."""
    checked = engine(loaded[backend])
    error = refused(checked, sql)
    assert error.sqlstate == "0A000", error
    assert "correlated subqueries are not supported" in str(error)
    assert checked.backend.statements == []  # type: ignore[union-attr]


@pytest.mark.parametrize("backend", BACKENDS)
def test_public_subqueries_run_alone_first_and_reach_the_private_query_as_constants(
    loaded: dict[str, Loaded], backend: str
) -> None:
    checked = engine(loaded[backend], schema.HIGH_LIMITS)
    sql = (
        "SELECT COUNT(*), SUM(age) FROM patients WHERE zip IN (SELECT zip FROM zip_info WHERE state = 'NY') "
        "AND age < (SELECT MAX(population) FROM zip_info) AND EXISTS (SELECT 1 FROM zip_info WHERE state = 'CA')"
    )
    plan = checked.plan(sql, salt="s")
    ran = checked.backend.statements  # type: ignore[union-attr]
    # Three public queries, each reading zip_info only, and nothing else.
    assert len(ran) == 3 and all("zip_info" in s and "patients" not in s for s in ran)
    assert plan.query.inlined_subqueries and not plan.query.subquery_placeholders
    for statement in plan.statements:
        assert "zip_info" not in statement
    # The answer is that of the same query written with the constants (zips of NY: 00501 and 10001).
    literal = checked.plan(
        "SELECT COUNT(*), SUM(age) FROM patients WHERE zip IN ('00501', '10001') AND age < 21000 AND TRUE",
        salt="s",
    )
    rows = [loaded[backend].run(s) for s in plan.statements]
    assert plan.measure(*rows) == literal.measure(*(loaded[backend].run(s) for s in literal.statements))


@pytest.mark.parametrize("backend", BACKENDS)
def test_public_subquery_answers_keep_sql_semantics(loaded: dict[str, Loaded], backend: str) -> None:
    """x IN (no rows) is false even for NULL x, NOT IN (no rows) true; NULLs in the list are kept."""
    checked = engine(loaded[backend], schema.HIGH_LIMITS)

    def count(where: str) -> int:
        plan = checked.plan(f"SELECT COUNT(*) FROM patients WHERE {where}", salt="s")
        return at_ceilings(plan, plan.measure(*(loaded[backend].run(s) for s in plan.statements))).components[
            0
        ][0]

    everyone = count("TRUE")
    assert count("zip IN (SELECT zip FROM zip_info WHERE FALSE)") == 0
    assert count("NOT zip IN (SELECT zip FROM zip_info WHERE FALSE)") == everyone
    # zip_info holds a NULL zip: NOT IN is then never true (SQL's three-valued logic).
    assert count("zip NOT IN (SELECT zip FROM zip_info)") == 0
    assert count("age > (SELECT population FROM zip_info WHERE FALSE)") == 0  # no row: NULL


def test_public_subquery_limits_are_documented_errors(loaded: dict[str, Loaded], monkeypatch) -> None:
    checked = engine(loaded["duckdb"])
    error = refused(checked, "SELECT COUNT(*) FROM patients WHERE age > (SELECT population FROM zip_info)")
    assert error.sqlstate == "21000" and "more than one row" in str(error)
    monkeypatch.setattr(subqueries, "MAX_INLINED_VALUES", 2)
    error = refused(checked, "SELECT COUNT(*) FROM patients WHERE zip IN (SELECT zip FROM zip_info)")
    assert error.sqlstate == "54000" and "join the public table" in str(error)
    error = refused(
        checked, "SELECT COUNT(*) FROM patients WHERE age > (SELECT 1 / MIN(population) FROM zip_info)"
    )
    assert error.sqlstate == "22000" and "nothing was charged" in str(error)
    error = refused(checked, "SELECT COUNT(*) FROM patients WHERE zip IN (SELECT zip FROM visits)")
    assert error.sqlstate == "0A000" and '"visits" is protected' in str(error)


def test_public_subqueries_without_a_backend_are_placeholders_never_run() -> None:
    offline = Engine(parse_policy(schema.policy_text()), None)
    plan = offline.plan("SELECT COUNT(*) FROM patients WHERE age > (SELECT MAX(population) FROM zip_info)")
    assert plan.query.subquery_placeholders
    assert (
        "placeholder"
        in offline.explain(
            "SELECT COUNT(*) FROM patients WHERE age > (SELECT MAX(population) FROM zip_info)"
        ).render()
    )


# -- class 2 -------------------------------------------------------------------------------------

NULLABLE_SIDE = [
    "SELECT COUNT(*) FROM zip_info z LEFT JOIN patients p ON z.zip = p.zip",
    "SELECT z.state, COUNT(p.age) FROM zip_info z LEFT JOIN patients p ON z.zip = p.zip GROUP BY z.state",
    "SELECT COUNT(*) FROM visits v LEFT JOIN patients p ON v.duration = p.age",
    "SELECT COUNT(*) FROM zip_info z JOIN patients p ON z.zip = p.zip LEFT JOIN visits v ON v.duration = p.age",
]


@pytest.mark.parametrize("sql", NULLABLE_SIDE)
def test_outer_join_protected_table_on_the_nullable_side_is_refused(
    loaded: dict[str, Loaded], sql: str
) -> None:
    error = refused(engine(loaded["duckdb"]), sql)
    assert error.sqlstate == "0A000" and "nullable side" in str(error)


PRESERVED_SIDE = [
    "SELECT COUNT(*), COUNT(z.state) FROM patients p LEFT JOIN zip_info z ON p.zip = z.zip",
    "SELECT z.state, COUNT(*) FROM patients p LEFT JOIN zip_info z ON p.zip = z.zip GROUP BY z.state",
    "SELECT COUNT(*), SUM(v.cost) FROM patients p LEFT JOIN visits v ON p.patient_id = v.patient_id",
    "SELECT COUNT(*), SUM(v.cost) FROM visits v LEFT JOIN patients p ON v.patient_id = p.patient_id AND p.age > 30",
    "SELECT p.diagnosis, COUNT(*) FROM zip_info z JOIN patients p ON z.zip = p.zip LEFT JOIN visits v ON v.patient_id = p.patient_id GROUP BY 1",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sql", PRESERVED_SIDE)
def test_outer_join_protected_table_on_the_preserved_side_keeps_its_sensitivity(
    loaded: dict[str, Loaded], backend: str, sql: str
) -> None:
    """Both join orders of protected and public tables: the certificate holds on every neighbour."""
    plan = engine(loaded[backend]).plan(sql, salt="s")
    db = loaded[backend].db
    assert db is not None
    certify(plan, loaded[backend].run, db.patient_ids)


# -- class 8 -------------------------------------------------------------------------------------

SILENT_OR_CRASHING = [
    ("SELECT COUNT(*) FROM patients p CROSS JOIN generate_series(1, 3) g", "table functions"),
    ("SELECT COUNT(*) FROM generate_series(1, 2) g JOIN patients p ON p.age = g", "table functions"),
    ("SELECT COUNT(*) FROM patients TABLESAMPLE SYSTEM (50)", "TABLESAMPLE"),
    (
        "SELECT COUNT(*) FROM patients p JOIN visits v TABLESAMPLE BERNOULLI (10) ON p.patient_id = v.patient_id",
        "TABLESAMPLE",
    ),
    ("SELECT COUNT(*) FROM ONLY patients", "ONLY"),
    ("SELECT COUNT(*) FROM unnest(ARRAY[1, 2]) u", "not supported"),
    ("SELECT COUNT(*) FROM (VALUES (1), (2)) v(x) JOIN patients p ON p.age = v.x", "not supported"),
    ("SELECT COUNT(*) FROM patients p JOIN LATERAL (SELECT 1) l ON TRUE", "supported in FROM"),
]


@pytest.mark.parametrize(("sql", "fragment"), SILENT_OR_CRASHING)
def test_crashes_and_silent_drops_in_from_are_refused(
    loaded: dict[str, Loaded], sql: str, fragment: str
) -> None:
    error = refused(engine(loaded["duckdb"]), sql)
    assert error.sqlstate == "0A000", error
    assert fragment in str(error)


@pytest.mark.parametrize(
    "sql", ["SELECT COUNT(*) FROM patients ORDER BY 0.5", "SELECT COUNT(*) FROM patients GROUP BY 2.5"]
)
def test_crashes_and_silent_drops_non_integer_positions(loaded: dict[str, Loaded], sql: str) -> None:
    error = refused(engine(loaded["duckdb"]), sql)
    assert error.sqlstate == "42601" and "non-integer constant" in str(error)


def test_crashes_and_silent_drops_a_parameter_in_order_by_is_a_value(loaded: dict[str, Loaded]) -> None:
    """ORDER BY $1 sorts by a constant in PostgreSQL; bound to 2 it must not become 'column 2'."""
    plan = engine(loaded["duckdb"]).plan(
        "SELECT diagnosis, COUNT(*) FROM patients GROUP BY 1 ORDER BY $1", [2]
    )
    (key,) = plan.query.post_processing.order_by
    assert "__out_" not in key.expression.sql()  # a constant, not the second output column


# -- class 9 -------------------------------------------------------------------------------------


def test_accepted_queries_run_outer_alias_in_a_from_subquery_is_refused(loaded: dict[str, Loaded]) -> None:
    """PostgreSQL refuses a FROM-subquery that names a table beside it (no LATERAL); so do we."""
    error = refused(
        engine(loaded["duckdb"]),
        "SELECT COUNT(*) FROM patients p JOIN (SELECT patient_id, cost FROM visits WHERE visits.cost > p.age) v "
        "ON p.patient_id = v.patient_id",
    )
    assert error.sqlstate == "42P01" and "invalid reference" in str(error)


RUNS = [
    "SELECT s.state, COUNT(*) FROM (SELECT p.patient_id, z.state FROM patients p LEFT JOIN zip_info z ON p.zip = z.zip) s GROUP BY s.state",
    "SELECT s.state, SUM(s.cost) FROM (SELECT p.patient_id, z.state, v.cost FROM patients p LEFT JOIN zip_info z ON p.zip = z.zip LEFT JOIN visits v ON v.patient_id = p.patient_id) s GROUP BY 1",
    "SELECT COUNT(*) FROM visits v JOIN (SELECT p.patient_id, z.state FROM patients p LEFT JOIN zip_info z ON p.zip = z.zip) s ON v.patient_id = s.patient_id",
    "SELECT SUM(123456789.123456789), SUM(income * 1000000) FROM patients",
    "SELECT COUNT(*) FROM patients WHERE age <= (0.1 + income) <> smoker",
    "SELECT COUNT(*) FROM visits WHERE department BETWEEN 'CA' AND 'er'",
    "SELECT MIN(a.age)::int4, VAR_SAMP(a.score) FROM patients a LEFT JOIN visits b ON a.patient_id = b.patient_id AND score BETWEEN 2 AND 3",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sql", RUNS)
def test_accepted_queries_run(loaded: dict[str, Loaded], backend: str, sql: str) -> None:
    plan = engine(loaded[backend]).plan(sql, salt="s")
    for statement in plan.statements:
        loaded[backend].run(statement)


@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("SELECT COUNT(*) FROM patients WHERE CAST(smoker AS smallint) = 1", "0A000"),
        ("SELECT COUNT(*) FROM patients WHERE extract(hour FROM birth) = 1", "0A000"),
        ("SELECT SUM(round(score, 2)) FROM patients", "42883"),
        # round(integer) is round(double precision) in PostgreSQL: a double, which takes no digits.
        ("SELECT SUM(round(abs(round(age)), 1)) FROM patients", "42883"),
        ("SELECT COUNT(*) FROM patients WHERE CAST(left('é', -2) AS smallint) < age", "0A000"),
        ("SELECT COUNT(*) FROM patients WHERE CAST(zip AS varchar(2)) = 'ab'", "0A000"),
    ],
)
def test_accepted_queries_run_or_are_refused_from_their_text(
    loaded: dict[str, Loaded], sql: str, sqlstate: str
) -> None:
    """What PostgreSQL would refuse at run time (or would compute differently) is refused up front."""
    assert refused(engine(loaded["duckdb"]), sql).sqlstate == sqlstate


# -- class 10 ------------------------------------------------------------------------------------

AGREEMENT = [
    # substring with a start below 1 counts characters before the first (PostgreSQL's meaning).
    "SELECT substring(zip, -1, 3) AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT substring(diagnosis, 0) AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT left(zip, -2) AS k, right(diagnosis, -1) AS r, COUNT(*) FROM patients GROUP BY 1, 2",
    # numeric division then multiplication; decimals compared with decimal constants.
    "SELECT SUM(income / 3 * 3), SUM(cost / 7) FROM patients p JOIN visits v ON p.patient_id = v.patient_id",
    "SELECT COUNT(*) FROM patients WHERE income / 3 * 3 = income AND income > 100.005",
    "SELECT COUNT(*) FROM visits WHERE temperature > 36.6 AND temperature <> 0.1",
    "SELECT SUM(score), AVG(score), MEDIAN(score), SUM(temperature) FROM patients p JOIN visits v ON p.patient_id = v.patient_id",
    "SELECT round(score * 10) AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT round(age) AS k, SUM(round(age)), SUM(round(age, 1)) FROM patients GROUP BY 1",
    "SELECT SUM(income % 7), SUM(mod(cost, 0.3)) FROM patients p JOIN visits v ON p.patient_id = v.patient_id",
    # text: case mapping, ILIKE, LIKE escapes, ordering, NULLs in LEAST.
    "SELECT lower(diagnosis) AS k, upper(zip) AS u, COUNT(*) FROM patients GROUP BY 1, 2",
    "SELECT COUNT(*) FROM patients WHERE diagnosis ILIKE 'É%' OR diagnosis LIKE 'a\\\\b' OR zip LIKE '9\\%'",
    "SELECT COUNT(*) FROM patients WHERE diagnosis < 'a' AND zip BETWEEN '0' AND 'Z'",
    "SELECT SUM(least(income, NULL, 3)), SUM(greatest(score, NULL)) FROM patients",
    # time zones and truncation.
    "SELECT date_trunc('day', checked_in) AS d, extract(hour FROM checked_in) AS h, COUNT(*) FROM visits GROUP BY 1, 2",
    "SELECT COUNT(*) FROM visits WHERE checked_in > '2023-03-01 00:00:00+02' AND CAST(checked_in AS date) < visit_date",
]


@pytest.mark.parametrize("sql", AGREEMENT)
def test_backends_agree_on_row_functions(loaded: dict[str, Loaded], sql: str) -> None:
    """The same plan on the same data gives the same pre-noise values on both engines."""
    answers = []
    for backend in BACKENDS:
        plan = engine(loaded[backend], schema.HIGH_LIMITS).plan(sql, salt="s")
        measured = at_ceilings(plan, plan.measure(*(loaded[backend].run(s) for s in plan.statements)))
        answers.append(dict(zip(measured.keys, measured.components, strict=True)))
    assert answers[0] == answers[1]


def test_backends_agree_substring_means_what_postgresql_means(loaded: dict[str, Loaded]) -> None:
    pg = loaded["postgres"]
    expected = {
        (k,): n
        for k, n in pg.run(
            "SELECT substring(zip, -1, 3), COUNT(*) FROM patients WHERE patient_id IS NOT NULL GROUP BY 1"
        )
    }
    plan = engine(pg, schema.HIGH_LIMITS).plan(
        "SELECT substring(zip, -1, 3), COUNT(*) FROM patients GROUP BY 1"
    )
    measured = at_ceilings(plan, plan.measure(*(pg.run(s) for s in plan.statements)))
    assert {k: c[0] for k, c in zip(measured.keys, measured.components, strict=True)} == expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM patients WHERE CAST(income AS text) = '1'",
        "SELECT COUNT(*) FROM patients WHERE concat(zip, score) = '1'",
        "SELECT COUNT(*) FROM patients WHERE initcap(zip) = 'A'",
        "SELECT COUNT(*) FROM patients WHERE CAST(score AS numeric) > 0",
    ],
)
def test_backends_agree_or_the_function_is_refused(loaded: dict[str, Loaded], sql: str) -> None:
    """Where the engines write or convert values differently, the construct is refused with a hint."""
    error = refused(engine(loaded["duckdb"]), sql)
    assert error.sqlstate == "0A000" and error.hint


# -- errors and spellings that one person decides (found by an adversarial review) ---------------

ONE_PERSON_DECIDES = [
    # Equal keys, spelled by whichever row came first: -0.0 or 0.0, numeric 30 or 30.00.
    "SELECT CAST(ceil((CASE WHEN zip = 'LONELY' THEN -1 ELSE 0 END) / 2.0) AS double precision) AS k, COUNT(*) FROM patients GROUP BY 1",
    "SELECT CASE WHEN zip = 'LONELY' THEN 30 ELSE income END AS k, COUNT(*) FROM patients GROUP BY 1",
    # Constant arithmetic computed in bigint, within its type: on DuckDB, smallint arithmetic used to
    # fail only for the rows reaching it (out of its type, it is refused: below).
    "SELECT COUNT(*) FROM patients WHERE CASE WHEN zip = 'LONELY' THEN CAST(32766 AS smallint) + CAST(1 AS smallint) ELSE 0 END > 0",
    "SELECT COUNT(*) FROM patients WHERE CASE WHEN zip = 'LONELY' THEN CAST(-32767 AS smallint) / CAST(-1 AS smallint) ELSE 0 END > 0",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sql", ONE_PERSON_DECIDES)
def test_one_person_decides_nothing_but_released_values(
    loaded: dict[str, Loaded], backend: str, sql: str
) -> None:
    """With and without person 1 (alone in zip LONELY): the query runs, and its groups are spelled
    alike (the certificate compares key spellings too)."""
    plan = engine(loaded[backend]).plan(sql, salt="s")
    certify(plan, loaded[backend].run, [1])


@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("SELECT COUNT(*) FROM patients WHERE left(diagnosis, 9223372036854775807) = 'F'", "22023"),
        ("SELECT COUNT(*) FROM patients WHERE substring(diagnosis, 2, 2147483648) = 'F'", "22023"),
        ("SELECT COUNT(*) FROM patients WHERE income < 'Infinity'", "0A000"),
        ("SELECT COUNT(*) FROM patients WHERE score = 'NaN'", "0A000"),
        ("SELECT COUNT(*) FROM patients WHERE score > '1e400'", "0A000"),
        ("SELECT COUNT(*) FROM patients WHERE floor(CAST('1e300' AS double precision)) > age", "0A000"),
        # Constants out of their integer type: PostgreSQL's planner refuses them, whatever the rows.
        ("SELECT COUNT(*) FROM patients WHERE -(-9223372036854775807 - 1) > age", "22003"),
        (
            "SELECT COUNT(*) FROM patients WHERE CASE WHEN zip = 'LONELY' THEN CAST(32767 AS smallint) + "
            "CAST(1 AS smallint) ELSE 0 END > 0",
            "22003",
        ),
        (
            "SELECT COUNT(*) FROM patients WHERE CASE WHEN zip = 'LONELY' THEN CAST(-32768 AS smallint) / "
            "CAST(-1 AS smallint) ELSE 0 END > 0",
            "22003",
        ),
        (
            "SELECT SUM(LEAST(t.n, 3)) FROM (SELECT v.patient_id, COUNT(*) n FROM patients p LEFT JOIN visits v "
            "ON v.patient_id = p.patient_id GROUP BY v.patient_id) t",
            "0A000",
        ),
    ],
)
def test_constants_the_engines_would_treat_differently_are_refused(
    loaded: dict[str, Loaded], sql: str, sqlstate: str
) -> None:
    assert refused(engine(loaded["duckdb"]), sql).sqlstate == sqlstate


# sqlglot reads `x IS NOT NULL`, `x NOT LIKE p` and `x NOT ILIKE p` as one node flagged `negate`; the
# analyzer rebuilt the node from its operands and dropped the flag, so `WHERE dep_delay IS NOT NULL`
# counted the rows where dep_delay is NULL (the flights: 6,050 against 328,521). Both engines ran
# the same wrong SQL and agreed; only the raw count tells, so common filters are checked against it.
FILTERS = [
    "income IS NULL",
    "income IS NOT NULL",
    "diagnosis NOT LIKE 'a%'",
    "diagnosis NOT ILIKE 'A%'",
    "diagnosis NOT LIKE 'a!%%' ESCAPE '!'",
    "smoker IS NOT TRUE",
    "NOT (income IS NOT NULL)",
    # The same check over the other common filters (none of these columns is clipped).
    "zip IN ('02139', '10001') OR zip IS NULL",
    "zip NOT IN ('02139', '10001')",
    "NOT smoker OR diagnosis = 'flu'",
    "smoker IS DISTINCT FROM TRUE",
    "zip IS NOT DISTINCT FROM NULL",
    "COALESCE(zip, 'none') = 'none'",
    "birth BETWEEN DATE '1960-01-01' AND DATE '1990-12-31'",
    "birth NOT BETWEEN DATE '1960-01-01' AND DATE '1990-12-31'",
    "length(zip) > 4 AND zip LIKE '%1%'",
    "upper(diagnosis) <> 'FLU'",
    "CASE WHEN smoker THEN 1 ELSE 0 END = 0",
    "EXTRACT(year FROM birth) >= 1980",
    "NOT (zip IS NULL OR smoker)",
    # A semi-join as Ibis writes it, answered as COALESCE(zip IN (…), FALSE): NULL zips on either side.
    "EXISTS (SELECT 1 FROM zip_info z WHERE z.zip = patients.zip)",
    "NOT EXISTS (SELECT 1 FROM zip_info z WHERE patients.zip = z.zip AND z.state = 'CA')",
    "NOT EXISTS (SELECT 1 FROM zip_info AS z WHERE z.zip = patients.zip) OR smoker",
    # Ibis's form of a filtered semi-join: the public table filtered in a named subquery.
    "EXISTS (SELECT 1 FROM (SELECT * FROM zip_info AS q WHERE q.state = 'CA') AS z WHERE patients.zip = z.zip)",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("predicate", FILTERS)
def test_filters_count_what_postgresql_counts(
    loaded: dict[str, Loaded], backend: str, predicate: str
) -> None:
    plan = engine(loaded[backend], schema.HIGH_LIMITS).plan(
        f"SELECT COUNT(*) FROM patients WHERE {predicate}", salt="s"
    )
    measured = at_ceilings(plan, plan.measure(*(loaded[backend].run(s) for s in plan.statements)))
    # PostgreSQL's count is the reference on both engines (DuckDB's own EXTRACT of year 12000 differs).
    raw = loaded["postgres"].run(
        f"SELECT COUNT(*) FROM patients WHERE ({predicate}) AND patient_id IS NOT NULL"
    )
    assert measured.components[0][0] == raw[0][0]


def test_negations_are_read_as_not_over_the_plain_predicate_in_every_clause() -> None:
    """The normal form every part of the analysis reads (HAVING and ORDER BY over released values
    too: `HAVING AVG(x) IS NOT NULL` kept the groups whose average was NULL)."""
    from dpproxy.sql.statement import parse_statement

    tree = parse_statement(
        "SELECT k FROM t WHERE a IS NOT NULL AND b NOT LIKE 'x!%' ESCAPE '!' GROUP BY k "
        "HAVING AVG(c) IS NOT NULL ORDER BY MAX(d) NOT ILIKE 'y' DESC"
    )
    assert tree.sql("postgres") == (
        "SELECT k FROM t WHERE NOT a IS NULL AND NOT b LIKE 'x!%' ESCAPE '!' GROUP BY k "
        "HAVING NOT AVG(c) IS NULL ORDER BY NOT MAX(d) ILIKE 'y' DESC"
    )
