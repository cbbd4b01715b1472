"""The plan cache: a statement whose shape was seen before (the same statement with other constants in
its row filter) gets exactly the plan a cold analysis of its text gives — the same SQL sent, the same
normalised text (the replay key and the ledger's record), the same row filter, noise and cost — and
no statement is answered from the cache where a cold analysis would refuse it.

Checked over the language generator's fixed batch and the SQL BI tools send (tests/sql/language/,
tests/sql/test_bi_tools.py), and over generated dashboard-style statements whose row filters
compare columns with integers in every way the analyser accepts and some it refuses: each is learned
once and asked again with other constants, in a new text, through both lookups (the parsed shape,
and the tokens of the text when it has no parameters).
"""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path

import pytest

from dpproxy.engine import Engine, Plan
from dpproxy.errors import DPProxyError
from dpproxy.policy import parse_policy
from dpproxy.sql.analyze import bind_parameters, parse_statement
from dpproxy.sql.public import backend_sql
from dpproxy.sql.query import PrivateQuery, PublicQuery
from dpproxy.sql.shape import (
    Shape,
    emitted,
    public_parameter_classes,
    statement_shape,
    token_shape,
    token_slots,
)
from tests.sql import test_bi_tools
from tests.sql.language import schema
from tests.sql.language.grammar import generate

SALT = "cache"
FIXED = 2000  # the language tests' fixed batch: seed 0, statements 0…1999

BI_STYLE = [
    # Metabase's question builder: a filter on a number column, qualified names.
    'SELECT "public"."patients"."diagnosis" AS "diagnosis", count(*) AS "count" FROM "public"."patients" '
    'WHERE "public"."patients"."age" > 30 GROUP BY "public"."patients"."diagnosis" ORDER BY "public"."patients"."diagnosis" ASC',
    # Superset: a range filter on a metric column, AVG and SUM.
    "SELECT department AS department, AVG(cost) AS avg_cost, SUM(duration) AS total FROM visits "
    "WHERE duration BETWEEN 10 AND 120 AND cost < 5000 GROUP BY department LIMIT 100",
    # A filter on a group key keeps its constant in the key (it can restrict the key's candidates).
    "SELECT age, COUNT(*) FROM patients WHERE age = 40 GROUP BY age",
    "SELECT diagnosis, COUNT(*) FROM patients WHERE age >= 18 AND age <= 65 OR income > 100 GROUP BY diagnosis",
    "SELECT p.zip, COUNT(*), AVG(v.cost) FROM patients p JOIN visits v ON p.patient_id = v.patient_id "
    "WHERE NOT (v.cost > 250) AND p.age <> 7 GROUP BY p.zip HAVING COUNT(*) > 5 ORDER BY 2 DESC",
    "SELECT department, MEDIAN(cost), percentile_cont(0.9) WITHIN GROUP (ORDER BY cost) FROM visits "
    "WHERE duration >= 15 GROUP BY department",
    "SELECT COUNT(*), SUM(income) FROM patients WHERE 20 < age",
    "SELECT department, COUNT(*) FROM visits WHERE cost > 100 GROUP BY department ORDER BY 2 DESC LIMIT 3",
]


def _engine() -> Engine:
    return Engine(parse_policy(schema.policy_text(schema.HIGH_LIMITS)), None)


def _statements() -> list[tuple[str, list[object]]]:
    found = [(g.sql, g.params) for g in (generate(0, i) for i in range(FIXED))]
    found += [(case[0], []) for case in test_bi_tools.GRAFANA + test_bi_tools.SUPERSET]
    found += [(case[0], []) for case in test_bi_tools.QUALIFIED_AS_UNQUALIFIED]
    found += [(sql, []) for sql in BI_STYLE]
    return found


def _cold(engine: Engine, sql: str, params: list[object] | None = None) -> Plan | DPProxyError | None:
    try:
        query = engine.analyze(sql, params or [])
        if not isinstance(query, PrivateQuery):
            return None
        return engine.plan_private(query, 1.0, salt=SALT)
    except DPProxyError as error:
        return error


def _variants(shape: Shape) -> list[tuple[str, ...]]:
    n = len(shape.slots)
    values = shape.values
    return [
        ("0",) * n,
        ("1",) * n,
        tuple(str((int(v) + 1) % 10**9) for v in values),  # a slot holds at most nine digits
        tuple(str(999_999_999 - i) for i in range(n)),
        tuple(str((int(v) * 7 + 3) % 1000) for v in values),
    ]


def _with(tree: object, shape: Shape, values: tuple[str, ...]) -> str:
    copy = tree.copy()  # type: ignore[attr-defined]
    nodes = list(copy.walk())
    for position, value in zip(shape.positions, values, strict=True):
        nodes[position].set("this", value)
    return copy.sql("postgres")


def _assert_same(hit: Plan | None, engine: Engine, text: str, params: list[object] | None = None) -> None:
    assert hit is not None, (text, params)
    cold = _cold(engine, text, params)
    # A cold analysis refusing it (or answering it as a probe) would be a wrong answer.
    assert isinstance(cold, Plan), f"{text}: cached, but a cold analysis gives {cold!r}"
    assert hit.statements == cold.statements, text
    # The rewrite the release reads (quantile refinement) holds this statement's constants too;
    # a plan whose release does not read it has none (nothing can read a sentinel there).
    if any(histogram.fine for histogram in hit.query.histograms):
        assert tuple(hit.rewrite.statements(hit.dialect)) == cold.statements, text
    else:
        assert not hit.rewrite.steps and not hit.rewrite.auxiliary, text
    assert hit.query.text == cold.query.text, text
    assert repr(hit.query) == repr(cold.query), text
    assert repr(hit.noise) == repr(cold.noise) and hit.cost == cold.cost, text


def _as_sent(
    sql: str, params: list[object], tree: object, shape: Shape, values: tuple[str, ...]
) -> tuple[str, list[object]] | None:
    """`sql` and `params` themselves with these numerals in place of the slots' (as a dashboard
    sends them): in the text, or as the parameters' new values."""
    tokens = token_shape(sql)
    found = token_slots(tokens, shape, tree, params) if tokens is not None else None  # type: ignore[arg-type]
    if tokens is None or found is None:
        return None
    out, at, new_params = [], 0, list(params)
    for index, value in sorted(zip(found[0], values, strict=True)):
        if index < 0:
            new_params[-index - 1] = int(value)
            continue
        start = tokens.starts[index]
        out += [sql[at:start], value]
        at = start + len(tokens.numerals[index])
    return "".join([*out, sql[at:]]), new_params


def _check(engine: Engine, statements: list[tuple[str, list[object]]]) -> tuple[int, int, int]:
    """Learn each statement's shape, then compare its hits with cold plans: (learned, compared
    through the parsed shape, compared through the tokens)."""
    learned = compared = by_tokens = 0
    for sql, params in statements:
        try:
            tree = bind_parameters(parse_statement(sql), params)
        except DPProxyError:
            continue
        shape = statement_shape(tree)
        if shape is None:
            continue
        first = _cold(engine, sql, params)
        if not isinstance(first, Plan):
            continue
        engine._learn_shape(shape, tree, first, SALT, sql=sql, params=params)  # a first sighting
        assert engine._shape_hit(shape, 1.0) is None, sql
        engine._learn_shape(shape, tree, first, SALT, sql=sql, params=params)
        if engine._shape_hit(shape, 1.0) is None:
            continue
        learned += 1
        for values in _variants(shape):
            # The statement as sqlglot spells it, with new numerals: a hit must be the cold plan
            # (a statement spelled alike but analysed differently, e.g. MEDIAN(x) respelled as
            # PERCENTILE_CONT(0.5) WITHIN GROUP, is another shape).
            variant = _with(tree, shape, values)
            other = statement_shape(parse_statement(variant))
            assert other is not None, variant
            hit = engine._shape_hit(other, 1.0)
            if other.text == shape.text or hit is not None:
                _assert_same(hit, engine, variant)
                compared += 1
            sent = _as_sent(sql, params, tree, shape, values)
            if sent is None:
                continue
            # The statement as sent, with new numerals: a hit through both lookups, the cold plan.
            same_text, same_params = sent
            other = statement_shape(bind_parameters(parse_statement(same_text), same_params))
            assert other is not None and other.text == shape.text, same_text
            _assert_same(engine._shape_hit(other, 1.0), engine, same_text, same_params)
            _assert_same(engine._token_hit(same_text, 1.0, same_params), engine, same_text, same_params)
            by_tokens += 1
    return learned, compared, by_tokens


def test_a_shape_seen_before_gives_exactly_the_cold_plan_of_its_text() -> None:
    learned, compared, by_tokens = _check(_engine(), _statements())
    # The batch holds statements of many shapes: some must be learned, or this test checks nothing.
    assert learned >= 8, learned
    assert compared >= learned * 4
    assert by_tokens >= 20, by_tokens


# Dashboard-style statements: a row filter comparing columns with integers (slots), among
# constants that must stay in the key: IN lists, arithmetic, casts, decimals, text, group keys,
# HAVING, LIMIT, ORDER BY positions.
_TABLES = {
    "patients": (["age", "income", "score", "patient_id"], ["diagnosis", "zip", "smoker", "age"]),
    "visits": (["duration", "cost", "temperature", "visit_id", "patient_id"], ["department", "duration"]),
    "survey": (["rating"], ["answer", "rating"]),
}
_AGGREGATES = ["COUNT(*)", "SUM({n})", "AVG({n})", "COUNT({n})", "MIN({n})", "MAX({n})", "MEDIAN({n})"]


def _predicate(rng: random.Random, numbers: list[str], params: list[object]) -> str:
    column = rng.choice(numbers)
    value = rng.choice([0, 1, 5, 7, 30, 120, 121, 300, 301, 2000, 500000, 2147483647, 999999999])
    n = str(value)
    if rng.random() < 0.25:  # sent as a parameter: an int, or a value of another kind
        params.append(rng.choice([value, value, Decimal(value), float(value), str(value)]))
        n = f"${len(params)}"
    shape = rng.randrange(12)
    if shape == 0:
        return f"{column} BETWEEN {n} AND {rng.randrange(1000)}"
    if shape == 1:
        return f"{n} {rng.choice(['<', '<=', '=', '<>'])} {column}"
    if shape == 2:
        return f"{column} IN ({n}, {rng.randrange(100)})"
    if shape == 3:
        return f"{column} + {rng.randrange(1, 9)} > {n}"
    if shape == 4:
        return f"CAST({column} AS bigint) >= {n}"
    if shape == 5:
        return f"{column} > {value}.5"
    if shape == 6:
        return f"NOT ({column} = {n})"
    if shape == 7:
        return f"{column} >= -{n}"
    if shape == 8:
        return f"({column} < {n} OR {column} IS NULL)"
    return f"{column} {rng.choice(['>', '>=', '<', '<=', '=', '<>', '!='])} {n}"


def _dashboard(rng: random.Random) -> tuple[str, list[object]]:
    table = rng.choice(list(_TABLES))
    numbers, keys = _TABLES[table]
    key = rng.choice([*keys, None])
    aggregates = [rng.choice(_AGGREGATES).format(n=rng.choice(numbers)) for _ in range(rng.randrange(1, 3))]
    connective = rng.choice([" AND ", " OR ", " AND "])
    params: list[object] = []
    where = connective.join(_predicate(rng, numbers, params) for _ in range(rng.randrange(1, 4)))
    select = ", ".join([key] * (key is not None) + aggregates)
    sql = f"SELECT {select} FROM {table} WHERE {where}"
    if key is not None:
        sql += f" GROUP BY {key}"
        if rng.random() < 0.3:
            sql += f" HAVING COUNT(*) > {rng.randrange(50)}"
        if rng.random() < 0.3:
            sql += f" ORDER BY {rng.choice([1, 2])} DESC"
    if rng.random() < 0.3:
        sql += f" LIMIT {rng.choice([0, 1, 10, 1000])}"
    return sql, params


def test_dashboard_statements_with_integer_filters_hit_exactly_the_cold_plan() -> None:
    rng = random.Random(11)
    statements = [_dashboard(rng) for _ in range(400)]
    learned, _, by_tokens = _check(_engine(), statements)
    assert learned >= 100, learned
    assert by_tokens == learned * 5, (by_tokens, learned)


def test_a_statement_differing_outside_its_slots_is_not_a_hit() -> None:
    engine = _engine()
    sql = "SELECT diagnosis, COUNT(*) FROM patients WHERE age > 30 GROUP BY diagnosis LIMIT 5"
    tree = parse_statement(sql)
    shape = statement_shape(tree)
    assert shape is not None
    plan = _cold(engine, sql)
    assert isinstance(plan, Plan)
    for _ in range(2):
        engine._learn_shape(shape, tree, plan, SALT, sql=sql)
    assert engine._token_hit(sql.replace("30", "31"), 1.0) is not None
    # Another LIMIT, another comparison, a comment, other spacing of the same tokens, another ε.
    assert engine._token_hit(sql.replace("LIMIT 5", "LIMIT 0"), 1.0) is None
    assert engine._token_hit(sql.replace("age > 30", "age >= 30"), 1.0) is None
    assert engine._token_hit(sql.replace("age > 30", "age > 30 /* x */"), 1.0) is None
    assert engine._token_hit(sql.replace("age > 30", "age > 3.0"), 1.0) is None
    assert engine._token_hit(sql.replace("age > 30", "age > 1234567890"), 1.0) is None
    assert engine._token_hit(sql.replace(" > ", ">"), 1.0) is not None
    assert engine._token_hit(sql, 0.5) is None


def test_a_parameter_is_a_slot_only_when_every_use_of_it_is() -> None:
    engine = _engine()
    sql = "SELECT diagnosis, COUNT(*) FROM patients WHERE age > $1 AND income < $2 GROUP BY diagnosis"
    reused = "SELECT diagnosis, COUNT(*) FROM patients WHERE age > $1 GROUP BY diagnosis HAVING COUNT(*) > $1"
    for text, params in ((sql, [30, "x"]), (sql, [30, 100]), (reused, [30])):
        tree = bind_parameters(parse_statement(text), params)
        shape = statement_shape(tree)
        plan = _cold(engine, text, params)
        if shape is None or not isinstance(plan, Plan):
            continue
        for _ in range(2):
            engine._learn_shape(shape, tree, plan, SALT, sql=text, params=params)
    _assert_same(engine._token_hit(sql, 1.0, [41, 100]), engine, sql, [41, 100])
    _assert_same(engine._token_hit(sql, 1.0, [41, 7]), engine, sql, [41, 7])
    # A value that would not be bound as an integer numeral is no slot value: a miss.
    for value in ("41", 41.0, Decimal("41.0"), True, None, -41, 10**10):
        assert engine._token_hit(sql, 1.0, [value, 100]) is None, value
    # $1 is also read in HAVING (no slot there): its value stays in the key.
    assert engine._token_hit(reused, 1.0, [31]) is None


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT age, COUNT(*) FROM patients WHERE age = 40 GROUP BY age",  # a group key's filter
        "SELECT COUNT(*) FROM patients WHERE age > 1.5",  # not an integer numeral
        "SELECT COUNT(*) FROM patients WHERE age > 30 LIMIT 0",  # a probe stays a probe
        "SELECT COUNT(*) FROM patients WHERE age + 1 > 30",  # arithmetic on the column
        "SELECT COUNT(*) FROM patients WHERE age > 1234567890",  # more digits than an integer's
        "SELECT COUNT(*) FROM patients WHERE 30 > 20",  # no column compared
    ],
)
def test_constants_the_analyser_reads_stay_in_the_key(sql: str) -> None:
    tree = parse_statement(sql)
    shape = statement_shape(tree)
    if shape is None:
        return
    # What is abstracted is only what is compared with a column that is not a group key.
    assert "LIMIT 0" in shape.text or "age = 40" in shape.text, shape.text


def test_the_shape_abstracts_constants_and_parameters_alike() -> None:
    literal = statement_shape(
        parse_statement("SELECT sex, COUNT(*) FROM patients WHERE age > 30 GROUP BY sex")
    )
    bound = statement_shape(
        bind_parameters(
            parse_statement("SELECT sex, COUNT(*) FROM patients WHERE age > $1 GROUP BY sex"), [41]
        )
    )
    assert literal is not None and bound is not None
    assert literal.values == ("30",) and bound.values == ("41",)
    assert "30" not in literal.text


DEMO_POLICY = Path(__file__).parent.parent / "policies" / "demo.yaml"


@pytest.fixture(params=["duckdb", "postgres"])
def demo_backend(request: pytest.FixtureRequest) -> str:
    if request.param == "duckdb":
        return str(request.getfixturevalue("demo_duckdb"))
    return request.getfixturevalue("demo_pg_dsn")


def test_a_dashboard_changing_its_filter_gets_answers_for_its_own_constant(
    demo_backend: str, tmp_path: Path
) -> None:
    """Through Engine.execute on a real backend: the third statement of a shape is answered from the
    learned plan (found from its tokens) and counts the rows its own filter keeps."""
    template = "SELECT sex, COUNT(*) AS n FROM patients WHERE age >= {} GROUP BY sex ORDER BY sex"
    with Engine.open(DEMO_POLICY, demo_backend, tmp_path / "ledger.sqlite") as engine:
        everyone = engine.execute(template.format(0), analyst="alice")
        engine.execute(template.format(1), analyst="alice")  # the shape is confirmed and learned
        learned = len(engine._token_shapes)
        nobody = engine.execute(template.format(200), analyst="alice")  # above every age
        assert learned == 1
        (plan,) = [p for k, p in engine._plans.items() if k[0] == template.format(200)]
        assert ">= 200" in plan.statements[0] and plan.query.text == template.format(200)
        assert [c.name for c in nobody.columns] == ["sex", "n"]
        assert nobody.cost == everyone.cost
        total = sum(row[1] for row in everyone.rows)
        assert total > 1000, everyone.rows
        assert all(abs(row[1]) < 100 for row in nobody.rows), nobody.rows


PUBLIC_WITH_PARAMETERS = [
    ("SELECT state FROM zip_info WHERE zip = $1", ["02139"], [["it's \\ a 'zip'"], [""], ["10001"]]),
    ("SELECT zip, population FROM zip_info WHERE population > $1 ORDER BY zip", [500], [[7], [2**31 - 1]]),
    ("SELECT zip FROM zip_info WHERE population BETWEEN $1 AND $2", [-5, 90], [[-(2**31), 2]]),
    ("SELECT zip, population + $1 AS p FROM zip_info WHERE state = $2 LIMIT $3", [3, "MA", 2], [[9, "x", 5]]),
    ("SELECT $1::text || state AS s FROM zip_info", ["a"], [["b'; DROP TABLE x; --"]]),
    ("SELECT count(*) FROM zip_info WHERE population < $1", [3_000_000_000], [[2**40 + 1]]),
]


@pytest.mark.parametrize(("sql", "first", "later"), PUBLIC_WITH_PARAMETERS)
def test_a_public_statement_with_new_parameters_gets_exactly_its_cold_sql(
    sql: str, first: list[object], later: list[list[object]]
) -> None:
    """A public statement seen twice with parameters of the same classes is answered from a template
    whose bound SQL and columns equal a cold analysis of every later set of values (each value a
    constant written by the analyser: quotes doubled, negatives parenthesised)."""
    engine = _engine()
    classes = public_parameter_classes(first)
    assert classes is not None
    cold = engine.analyze(sql, first)
    assert isinstance(cold, PublicQuery)
    public = (cold, backend_sql(cold.sql, engine.dialect))
    engine._learn_public(sql, first, classes, public)
    assert engine._public_template(sql, classes) is None  # a first sighting learns nothing
    engine._learn_public(sql, first, classes, public)
    learned = engine._public_template(sql, classes)
    assert learned is not None
    for values in [first, *later]:
        assert public_parameter_classes(values) == classes, values
        expected = engine.analyze(sql, values)
        assert isinstance(expected, PublicQuery)
        bound = learned[1].bind(tuple(emitted(v, engine.dialect) for v in values))
        assert bound == backend_sql(expected.sql, engine.dialect)
        assert [(o.name, o.type) for o in learned[0].outputs] == [(o.name, o.type) for o in expected.outputs]


def test_parameters_of_another_class_or_zero_are_not_templated() -> None:
    assert public_parameter_classes([1]) != public_parameter_classes([-1])
    assert public_parameter_classes([1]) != public_parameter_classes([2**31])
    assert public_parameter_classes([1]) != public_parameter_classes(["1"])
    assert public_parameter_classes([0]) is None
    assert public_parameter_classes([True]) is None
    assert public_parameter_classes([1.5]) is None
    assert public_parameter_classes([2**63]) is None


def test_a_public_statement_whose_parameter_is_read_as_a_value_is_not_templated() -> None:
    """`to_date($1, …)` reads its text (folded into a date constant): analysed with a sentinel it is
    refused, so the statement is analysed afresh each time."""
    engine = _engine()
    sql = "SELECT zip FROM zip_info WHERE to_date($1, 'YYYY-MM-DD') > DATE '2020-01-01'"
    cold = engine.analyze(sql, ["2021-05-01"])
    assert isinstance(cold, PublicQuery)
    classes = public_parameter_classes(["2021-05-01"])
    assert classes is not None
    public = (cold, backend_sql(cold.sql, engine.dialect))
    for _ in range(3):
        engine._learn_public(sql, ["2021-05-01"], classes, public)
    assert engine._public_template(sql, classes) is None


def test_public_statements_with_new_parameters_answer_through_the_engine(
    demo_backend: str, tmp_path: Path
) -> None:
    """On a real backend: the third execution is a template hit and returns its own rows."""
    sql = "SELECT zip, state FROM zip_info WHERE zip = $1"
    with Engine.open(DEMO_POLICY, demo_backend, tmp_path / "ledger.sqlite") as engine:
        everything = engine.execute("SELECT zip, state FROM zip_info ORDER BY zip", analyst="alice").rows
        zips = [row[0] for row in everything[:3]]
        answers = [engine.execute(sql, [z], analyst="alice").rows for z in zips]
        assert len(engine._public_templates) == 1
        assert answers == [[row] for row in everything[:3]]
        assert engine.execute(sql, ["no such zip'"], analyst="alice").rows == []
