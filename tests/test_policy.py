"""The policy loader: what a data owner sees when a policy is right, and when it is wrong.

Every rejection must name the file, the line, the key path and a fix, and all problems of a file
are reported at once. SCRAM verifiers must interoperate with a real SCRAM client and PostgreSQL.
"""

from __future__ import annotations

import datetime
import textwrap
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scramp import ScramClient, ScramException, ScramMechanism

from dpproxy.errors import PolicyError
from dpproxy.policy import (
    ColumnType,
    Defaults,
    Mechanism,
    Policy,
    check_against_schema,
    column_type_from_sql,
    draft_policy,
    load_policy,
    parse_policy,
)
from dpproxy.scram import is_verifier, make_verifier, parse_verifier

POLICIES = Path(__file__).resolve().parent.parent / "policies"
SOURCE = "owner.yaml"

# A verifier for the password "pw", made once (PBKDF2 is deliberately slow).
PW_VERIFIER = make_verifier("pw")


def yaml_text(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def load(text: str) -> Policy:
    return parse_policy(yaml_text(text), SOURCE)


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(yaml_text(text), SOURCE)
    assert info.value.problems, "a PolicyError must carry its problems"
    return info.value.problems


def assert_problem(found: list[str], line: int, path: str, *fragments: str) -> str:
    """One problem is on `line` of the file, about `path`, and contains every fragment."""
    prefix = f"{SOURCE}:{line}: {path}: "
    matching = [p for p in found if p.startswith(prefix) and all(f in p for f in fragments)]
    assert matching, f"no problem {prefix}... with {fragments!r} in:\n" + "\n".join(found)
    return matching[0]


def only_problem(text: str, line: int, path: str, *fragments: str) -> str:
    found = problems(text)
    assert len(found) == 1, "\n".join(found)
    return assert_problem(found, line, path, *fragments)


# A protected table the tests vary one key at a time; line numbers below count from `version`.
TABLE = """
    version: 1
    tables:
      t:
        privacy_unit: pid
        columns:
          pid: {type: integer}
          x: {type: integer, lower: 0, upper: 10}
"""


def test_minimal_policy_loads_with_defaults():
    policy = load(TABLE)
    assert policy.version == 1
    assert policy.source == SOURCE
    assert policy.analysts == ()
    assert policy.defaults.mechanism is Mechanism.LAPLACE
    table = policy.table("t")
    assert table is not None and table.privacy_unit == "pid" and not table.public
    assert (table.max_groups_per_unit, table.max_rows_per_unit) == (1, 1)
    x = table.column("x")
    assert x is not None and x.bounded and x.summable
    assert (x.lower, x.upper) == (Decimal(0), Decimal(10))
    pid = table.column("pid")
    assert pid is not None and not pid.bounded  # the unit has no bounds, so it is never summed


# --- unknown keys, wrong types, missing keys ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "path", "fix"),
    [
        ("version: 1\ntabels: {}\n", 2, "tabels", "did you mean `tables`?"),
        (
            "version: 1\ndefaults: {epsilom: 0.5}\ntables: {t: {public: true}}\n",
            2,
            "defaults.epsilom",
            "`epsilon`",
        ),
        (
            "version: 1\nanalysts:\n  a: {epsilon: 1, delta: 0, max_epsilon_per_querry: 1}\n"
            "tables: {t: {public: true}}\n",
            3,
            "analysts.a.max_epsilon_per_querry",
            "`max_epsilon_per_query`",
        ),
        (
            "version: 1\ntables:\n  t:\n    privacy_unit: row\n    max_row_per_unit: 1\n"
            "    columns: {a: {type: text}}\n",
            5,
            "tables.t.max_row_per_unit",
            "`max_rows_per_unit`",
        ),
        (
            "version: 1\ntables:\n  t:\n    privacy_unit: row\n    columns:\n"
            "      a: {type: integer, lowr: 0, upper: 1}\n",
            6,
            "tables.t.columns.a.lowr",
            "`lower`",
        ),
        (
            "version: 1\nfoo: 1\ntables: {t: {public: true}}\n",
            2,
            "foo",
            "allowed keys here: version, defaults",
        ),
    ],
)
def test_unknown_keys_are_reported_with_the_closest_known_key(text, line, path, fix):
    found = problems(text)
    assert_problem(found, line, path, "unknown key", fix)


@pytest.mark.parametrize(
    ("text", "line", "path", "fragment"),
    [
        ('version: "1"\ntables: {t: {public: true}}\n', 1, "version", "expected a whole number"),
        ("version: 1.0\ntables: {t: {public: true}}\n", 1, "version", "must be a whole number"),
        ("version: true\ntables: {t: {public: true}}\n", 1, "version", "expected a whole number"),
        (
            "version: 1\ndefaults: {epsilon: lots}\ntables: {t: {public: true}}\n",
            2,
            "defaults.epsilon",
            "expected a number",
        ),
        (
            "version: 1\ndefaults: {epsilon: '0.5'}\ntables: {t: {public: true}}\n",
            2,
            "defaults.epsilon",
            "without quotes",
        ),
        ("version: 1\ndefaults: [1]\ntables: {t: {public: true}}\n", 2, "defaults", "expected a mapping"),
        ("version: 1\nanalysts: [alice]\ntables: {t: {public: true}}\n", 2, "analysts", "expected a mapping"),
        ("version: 1\ntables: {t: {public: 'yes'}}\n", 2, "tables.t.public", "expected true or false"),
        ("version: 1\ntables: [t]\n", 2, "tables", "expected a mapping"),
        (
            "version: 1\ntables:\n  t: {public: true, columns: {a: {type: [text]}}}\n",
            3,
            "tables.t.columns.a.type",
            "expected text",
        ),
        (
            "version: 1\ntables:\n  t: {public: true, columns: {a: integer}}\n",
            3,
            "tables.t.columns.a",
            "{type: integer",
        ),
    ],
)
def test_wrong_value_types_are_reported(text, line, path, fragment):
    assert_problem(problems(text), line, path, fragment)


def test_missing_required_keys_are_reported():
    found = problems("defaults: {epsilon: 0.5}\n")
    assert_problem(found, 1, "version", "missing", "add `version: 1`")
    assert_problem(found, 1, "tables", "missing", "add `tables:`")
    only_problem(
        "version: 1\ntables:\n  t: {public: true, columns: {a: {}}}\n",
        3,
        "tables.t.columns.a.type",
        "missing",
    )
    found = problems("version: 1\nanalysts:\n  a: {password: null}\ntables: {t: {public: true}}\n")
    assert_problem(found, 3, "analysts.a.epsilon", "missing")
    assert_problem(found, 3, "analysts.a.delta", "missing")


def test_analysts_may_be_empty_or_absent():
    assert load("version: 1\ntables: {t: {public: true}}\n").analysts == ()
    assert load("version: 1\nanalysts: {}\ntables: {t: {public: true}}\n").analysts == ()
    assert load("version: 1\nanalysts:\ntables: {t: {public: true}}\n").analysts == ()


def test_version_must_be_1():
    only_problem(
        "version: 2\ntables: {t: {public: true}}\n", 1, "version", "unsupported version 2", "`version: 1`"
    )


def test_empty_policy_and_non_mapping_are_rejected():
    with pytest.raises(PolicyError) as info:
        parse_policy("", SOURCE)
    assert "expected a mapping with `version` and `tables`" in info.value.problems[0]
    assert_problem(problems("- version: 1\n"), 1, "(top level)", "found a list")
    only_problem("version: 1\ntables: {}\n", 2, "tables", "no tables", "at least one table")


def test_yaml_syntax_errors_name_the_line():
    found = problems("version: 1\ntables:\n  t: {public: true\n  u: 1\n")
    assert len(found) == 1
    assert (
        found[0].startswith(f"{SOURCE}:")
        and "not valid YAML" in found[0]
        and "fix the YAML syntax" in found[0]
    )
    assert_problem(problems("version: 1\ntables:\n\tt: 1\n"), 3, "(yaml)", "tabs")


# --- names ----------------------------------------------------------------------------------


def test_duplicate_yaml_keys_are_reported_not_silently_overwritten():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: pid
            columns:
              pid: {type: integer}
              x: {type: integer, lower: 0, upper: 10}
              x: {type: text}
        tables: {u: {public: true}}
    """
    found = problems(text)
    assert_problem(found, 8, "tables.t.columns.x", "duplicate key (first given on line 7)", "keep only one")
    assert_problem(found, 9, "tables", "duplicate key (first given on line 2)")
    assert len(found) == 2


def test_names_equal_after_case_folding_are_rejected():
    text = """
        version: 1
        analysts:
          ann: {epsilon: 1, delta: 0}
          Ann: {epsilon: 1, delta: 0}
        tables:
          t:
            privacy_unit: row
            columns: {a: {type: text}, A: {type: text}}
          T: {public: true}
    """
    found = problems(text)
    assert_problem(found, 4, "analysts.Ann", "same analyst name as `ann` (line 3)", "rename or remove one")
    assert_problem(found, 8, "tables.t.columns.A", "same column name as `a`")
    assert_problem(found, 9, "tables.T", "same table name as `t`")
    assert_problem(found, 9, "tables.T", "not a valid table name", "lowercase letters")


@pytest.mark.parametrize("name", ["my-table", "1st", "Patients", "a b", "x" * 64])
def test_names_must_be_sql_identifiers(name):
    text = f'version: 1\ntables:\n  "{name}": {{public: true}}\n'
    only_problem(text, 3, f"tables.{name}", "not a valid table name", "lowercase letters, digits and _")


def test_yaml_1_1_spellings_keep_their_meaning():
    # `no` and `on` are booleans to YAML 1.1 and 1e-5 is a string; 010 is octal. None of that
    # should leak into a policy: keys are names as written and numbers are read as decimals.
    text = """
        version: 1
        analysts:
          a: {epsilon: 1, delta: 1e-5}
        tables:
          t:
            privacy_unit: row
            columns:
              no: {type: integer, lower: 010, upper: 1e3}
              on: {type: text, public_values: [00501, NO, yes, 1.50]}
    """
    policy = load(text)
    assert policy.analyst("a").delta == 1e-5
    table = policy.table("t")
    assert table.column("no").lower == 10 and table.column("no").upper == 1000
    assert table.column("on").public_values == ("00501", "NO", "yes", "1.50")


def test_alias_bombs_are_refused_quickly():
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 8):
        levels.append(f"l{i}: &l{i} [" + ", ".join([f"*{'a' if i == 1 else f'l{i - 1}'}"] * 10) + "]")
    text = "version: 1\n" + "\n".join(levels) + "\ntables: {t: {public: true}}\n"
    with pytest.raises(PolicyError) as info:
        parse_policy(text, SOURCE)
    assert "once aliases are expanded" in info.value.problems[0]


def test_merge_keys_share_settings_and_own_keys_win():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: row
            columns:
              a: &money {type: numeric, lower: 0, upper: 100, scale: 2}
              b: {<<: *money, upper: 50}
    """
    table = load(text).table("t")
    assert table.column("a").upper == 100
    b = table.column("b")
    assert (b.type, b.lower, b.upper, b.scale) == (ColumnType.NUMERIC, 0, 50, 2)


# --- column types ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("int", ColumnType.INTEGER),
        ("int4", ColumnType.INTEGER),
        ("INTEGER", ColumnType.INTEGER),
        ("int8", ColumnType.BIGINT),
        ("int2", ColumnType.SMALLINT),
        ("decimal", ColumnType.NUMERIC),
        ("numeric(12, 2)", ColumnType.NUMERIC),
        ("float8", ColumnType.DOUBLE),
        ("double", ColumnType.DOUBLE),
        ("double  precision", ColumnType.DOUBLE),
        ("float4", ColumnType.REAL),
        ("string", ColumnType.TEXT),
        ("character varying", ColumnType.VARCHAR),
        ("varchar(40)", ColumnType.VARCHAR),
        ("bool", ColumnType.BOOLEAN),
        ("timestamp with time zone", ColumnType.TIMESTAMPTZ),
        ("timestamp without time zone", ColumnType.TIMESTAMP),
    ],
)
def test_type_aliases_map_to_postgresql_types(written, expected):
    policy = load(f"version: 1\ntables:\n  t: {{public: true, columns: {{a: {{type: '{written}'}}}}}}\n")
    assert policy.table("t").column("a").type is expected
    assert column_type_from_sql(written) is expected


@pytest.mark.parametrize("written", ["json", "float", "integer[]", "int(4)", "money"])
def test_unsupported_types_are_rejected_listing_the_accepted_ones(written):
    text = f'version: 1\ntables:\n  t: {{public: true, columns: {{a: {{type: "{written}"}}}}}}\n'
    only_problem(
        text, 3, "tables.t.columns.a.type", f"unsupported type `{written}`", "accepted types: smallint"
    )
    assert column_type_from_sql(written) is None


def test_numeric_type_modifier_sets_the_grid_scale_unless_scale_is_given():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: row
            columns:
              a: {type: "numeric(12,4)", lower: 0, upper: 1}
              b: {type: "numeric(12,4)", lower: 0, upper: 1, scale: 1}
    """
    table = load(text).table("t")
    assert table.column("a").grid_scale == 4
    assert table.column("b").grid_scale == 1


# --- bounds, summable, scale -----------------------------------------------------------------


def bounded_column(spec: str, column_type: str = "numeric") -> str:
    # The column `a` is on line 6.
    head = "version: 1\ntables:\n  t:\n    privacy_unit: row\n    columns:\n"
    return head + f"      a: {{type: {column_type}, {spec}}}\n"


def test_bounds_are_exact_decimals_from_the_text():
    column = load(bounded_column("lower: -0.1, upper: 0.3")).table("t").column("a")
    assert column.lower == Decimal("-0.1") and column.upper == Decimal("0.3")
    assert isinstance(column.lower, Decimal)


@settings(max_examples=50)
@given(
    st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False, allow_infinity=False),
    st.decimals(min_value=0, max_value=10**9, places=2, allow_nan=False, allow_infinity=False),
)
def test_any_decimal_bound_is_kept_exactly(lower, width):
    upper = lower + width
    column = load(bounded_column(f"lower: {lower}, upper: {upper}")).table("t").column("a")
    assert (column.lower, column.upper) == (lower, upper)


@pytest.mark.parametrize(
    ("spec", "column_type", "path", "fragments"),
    [
        ("lower: 1", "numeric", "lower", ("`upper` is missing", "give both lower and upper")),
        ("upper: 1", "numeric", "upper", ("`lower` is missing", "give both lower and upper")),
        ("lower: 5, upper: 1", "numeric", "lower", ("greater than upper", "swap them")),
        ("lower: 0.5, upper: 10", "integer", "lower", ("whole number",)),
        ("lower: 0, upper: 40000", "smallint", "upper", ("outside the range of smallint",)),
        ("lower: '0', upper: 1", "numeric", "lower", ("expected a number", "without quotes")),
        ("lower: 0, upper: .inf", "numeric", "upper", ("finite",)),
        (
            "lower: 0, upper: 0.001",
            "numeric",
            "upper",
            ("more decimal places than the column's grid", "scale"),
        ),
        ("lower: 0, upper: 1e17", "numeric", "upper", ("too large", "fit in a bigint")),
        ("lower: 0", "text", "lower", ("only to number columns", "remove `lower`")),
        ("upper: 1", "date", "upper", ("only to number columns",)),
        ("scale: 2, summable: false", "integer", "scale", ("only to numeric, real and double precision",)),
        ("lower: 0, upper: 1, scale: 10", "numeric", "scale", ("between 0 and 9",)),
        ("lower: 0, upper: 1, scale: 1.5", "numeric", "scale", ("whole number",)),
        ("summable: true", "text", "summable", ("only to number columns",)),
    ],
)
def test_bad_bounds_and_scales_are_rejected(spec, column_type, path, fragments):
    only_problem(bounded_column(spec, column_type), 6, f"tables.t.columns.a.{path}", *fragments)


def test_bounds_on_the_grid_of_an_explicit_scale_are_accepted():
    column = load(bounded_column("lower: 0, upper: 0.001, scale: 3")).table("t").column("a")
    assert column.upper == Decimal("0.001") and column.grid_scale == 3


def test_number_columns_need_bounds_or_summable_false():
    found = only_problem(
        bounded_column("scale: 2"), 6, "tables.t.columns.a", "needs bounds to be summed", "`summable: false`"
    )
    assert "add `lower:` and `upper:`" in found
    column = load(bounded_column("summable: false")).table("t").column("a")
    assert not column.summable and not column.bounded
    assert load(bounded_column("lower: 0, upper: 1")).table("t").column("a").summable


def test_summable_is_false_only_where_the_policy_says_so():
    # Columns that are not summed themselves may still appear inside a SUM: SUM(CASE WHEN x ...).
    table = load(TABLE.replace("x: {type: integer, lower: 0, upper: 10}", "x: {type: text}")).table("t")
    assert table.column("x").summable
    text = TABLE.replace("pid: {type: integer}", "pid: {type: integer, summable: false}")
    assert not load(text).table("t").column("pid").summable


# --- public values ---------------------------------------------------------------------------


def test_public_values_take_the_column_type():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: row
            columns:
              s: {type: text, public_values: [flu, "cold", 42]}
              n: {type: smallint, public_values: [1, -2, 3], summable: false}
              b: {type: boolean, public_values: [true, false]}
              d: {type: date, public_values: [2024-01-31, "2024-02-01"]}
              ts: {type: timestamp, public_values: [2024-01-31 08:00:00]}
              tz: {type: timestamptz, public_values: [2024-01-31 08:00:00+00:00]}
              m: {type: numeric, lower: 0, upper: 1, public_values: [0.5, 0.25]}
    """
    table = load(text).table("t")
    assert table.column("s").public_values == ("flu", "cold", "42")
    assert table.column("n").public_values == (1, -2, 3)
    assert table.column("b").public_values == (True, False)
    assert table.column("d").public_values == (datetime.date(2024, 1, 31), datetime.date(2024, 2, 1))
    assert table.column("ts").public_values == (datetime.datetime(2024, 1, 31, 8),)
    assert table.column("tz").public_values == (datetime.datetime(2024, 1, 31, 8, tzinfo=datetime.UTC),)
    assert table.column("m").public_values == (Decimal("0.5"), Decimal("0.25"))
    assert all(isinstance(v, bool) for v in table.column("b").public_values)


@pytest.mark.parametrize(
    ("spec", "column_type", "path", "fragments"),
    [
        ("public_values: []", "text", "public_values", ("non-empty list",)),
        ("public_values: flu", "text", "public_values", ("non-empty list",)),
        ("public_values: [a, b, a]", "text", "public_values[2]", ("repeats item 0", "list each value once")),
        ("public_values: [a, null]", "text", "public_values[1]", ("NULL is never a public value",)),
        (
            "public_values: [1, two], summable: false",
            "integer",
            "public_values[1]",
            ("expected a whole number",),
        ),
        ("public_values: [1, 1.0], summable: false", "integer", "public_values[1]", ("whole number",)),
        ("public_values: [true, 'no']", "boolean", "public_values[1]", ("expected true or false",)),
        ("public_values: [2024-02-30]", "date", "public_values[0]", ("expected a date", "YYYY-MM-DD")),
        ("public_values: [2024-01-01 10:00:00]", "timestamptz", "public_values[0]", ("UTC offset",)),
    ],
)
def test_bad_public_values_are_rejected(spec, column_type, path, fragments):
    only_problem(bounded_column(spec, column_type), 6, f"tables.t.columns.a.{path}", *fragments)


def test_public_values_are_not_allowed_on_the_privacy_unit():
    text = TABLE.replace("pid: {type: integer}", "pid: {type: integer, public_values: [1, 2]}")
    only_problem(text, 6, "tables.t.columns.pid.public_values", "privacy unit", "remove `public_values`")


# --- privacy unit and contribution limits ----------------------------------------------------


def test_privacy_unit_is_required_on_protected_tables():
    text = "version: 1\ntables:\n  t:\n    columns: {a: {type: text}}\n"
    only_problem(text, 3, "tables.t.privacy_unit", "missing", "`row`", "`public: true`")


def test_privacy_unit_must_name_a_listed_column():
    found = only_problem(TABLE.replace("privacy_unit: pid", "privacy_unit: pdi"), 4, "tables.t.privacy_unit")
    assert "`pdi` is not a listed column" in found and "did you mean `pid`?" in found


def test_row_unit_tables_cannot_raise_contribution_limits():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: row
            max_groups_per_unit: 2
            max_rows_per_unit: 1
            columns: {a: {type: text}}
    """
    only_problem(text, 5, "tables.t.max_groups_per_unit", "must be 1 when the privacy unit is `row`")
    table = load(text.replace("max_groups_per_unit: 2", "max_groups_per_unit: 1")).table("t")
    assert table.unit_is_row and table.privacy_unit is None


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("0", "between 1 and 1000"), ("1001", "almost certainly a mistake"), ("2.5", "whole")],
)
def test_contribution_limits_are_positive_and_sane(value, fragment):
    text = TABLE.replace("privacy_unit: pid", f"privacy_unit: pid\n        max_rows_per_unit: {value}")
    only_problem(text, 5, "tables.t.max_rows_per_unit", fragment)


def test_contribution_limits_are_loaded():
    limits = "\n        max_groups_per_unit: 3\n        max_rows_per_unit: 1000"
    text = TABLE.replace("privacy_unit: pid", "privacy_unit: pid" + limits)
    table = load(text).table("t")
    assert (table.max_groups_per_unit, table.max_rows_per_unit) == (3, 1000)


def test_the_unit_column_takes_no_bounds_or_summable_true():
    text = TABLE.replace("pid: {type: integer}", "pid: {type: integer, lower: 0, upper: 9, summable: true}")
    found = problems(text)
    assert_problem(found, 6, "tables.t.columns.pid.lower", "privacy unit column", "remove `lower`")
    assert_problem(found, 6, "tables.t.columns.pid.upper", "privacy unit column")
    assert_problem(found, 6, "tables.t.columns.pid.summable", "cannot be summed")
    assert len(found) == 3


def test_protected_table_needs_columns():
    only_problem("version: 1\ntables:\n  t: {privacy_unit: row}\n", 3, "tables.t.columns", "missing")


# --- public tables ---------------------------------------------------------------------------


def test_public_tables_take_optional_typed_columns_and_no_privacy_keys():
    policy = load(
        "version: 1\ntables:\n  z: {public: true}\n"
        "  y: {public: true, schema: ref, columns: {n: {type: int}}}\n"
    )
    z, y = policy.table("z"), policy.table("y")
    assert z.public and z.columns == ()
    assert y.schema == "ref" and y.column("n").type is ColumnType.INTEGER
    text = """
        version: 1
        tables:
          z:
            public: true
            privacy_unit: zip
            max_rows_per_unit: 2
            columns: {zip: {type: text, public_values: [a]}, n: {type: integer, lower: 0, upper: 1}}
    """
    found = problems(text)
    assert_problem(
        found, 5, "tables.z.privacy_unit", "public table has no privacy unit", "remove `privacy_unit`"
    )
    assert_problem(found, 6, "tables.z.max_rows_per_unit", "public table")
    assert_problem(found, 7, "tables.z.columns.zip.public_values", "read raw")
    assert_problem(found, 7, "tables.z.columns.n.lower", "read raw", "remove `lower`")
    assert_problem(found, 7, "tables.z.columns.n.upper", "read raw")
    assert len(found) == 5


def test_a_table_with_nothing_under_it_is_rejected():
    only_problem("version: 1\ntables:\n  z:\n", 3, "tables.z", "expected a mapping", "{public: true}")


# --- defaults ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("defaults", "path", "fragment"),
    [
        ("epsilon: 0", "defaults.epsilon", "greater than 0"),
        ("epsilon: -1", "defaults.epsilon", "greater than 0"),
        ("delta: 1", "defaults.delta", "below 1"),
        ("delta: -0.1", "defaults.delta", "at least 0"),
        (
            "mechanism: gaussian, delta: 0",
            "defaults.delta",
            "gaussian mechanism needs a delta greater than 0",
        ),
        ("mechanism: cauchy", "defaults.mechanism", "laplace or gaussian"),
        ("min_epsilon: 0.6", "defaults.min_epsilon", "min_epsilon <= epsilon <= max_epsilon"),
        ("epsilon: 2", "defaults.epsilon", "min_epsilon <= epsilon <= max_epsilon"),
        ("min_epsilon: 2, max_epsilon: 1, epsilon: 1.5", "defaults.epsilon", "min_epsilon <= epsilon"),
        ("epsilon: .inf", "defaults.epsilon", "finite"),
        ("epsilon: .nan", "defaults.epsilon", "finite"),
        ("epsilon: 1e400", "defaults.epsilon", "too large to be a finite number"),
    ],
)
def test_bad_defaults_are_rejected(defaults, path, fragment):
    only_problem(
        f"version: 1\ndefaults: {{{defaults}}}\ntables: {{t: {{public: true}}}}\n", 2, path, fragment
    )


def test_defaults_are_loaded():
    text = (
        "version: 1\ndefaults: {epsilon: 0.2, delta: 1e-6, mechanism: gaussian, max_epsilon: 0.5}\n"
        "tables: {t: {public: true}}\n"
    )
    defaults = load(text).defaults
    assert (defaults.epsilon, defaults.delta, defaults.mechanism) == (0.2, 1e-6, Mechanism.GAUSSIAN)
    assert (defaults.min_epsilon, defaults.max_epsilon) == (0.001, 0.5)


# --- accounting and replay ----------------------------------------------------------------------


def test_accounting_is_pure_and_replay_on_by_default():
    defaults = load("version: 1\ndefaults: {epsilon: 0.2}\ntables: {t: {public: true}}\n").defaults
    assert (defaults.accounting, defaults.replay, defaults.mechanism) == ("pure", True, Mechanism.LAPLACE)
    assert load(TABLE).defaults == Defaults()
    assert (Defaults().accounting, Defaults().replay) == ("pure", True)


def test_zcdp_accounting_implies_gaussian_noise():
    text = """
        version: 1
        defaults:
          accounting: zcdp
          replay: false
        analysts:
          ann: {epsilon: 10, delta: 1.0e-5}
        tables: {t: {public: true}}
    """
    defaults = load(text).defaults
    assert (defaults.accounting, defaults.mechanism, defaults.delta) == ("zcdp", Mechanism.GAUSSIAN, 1e-7)
    assert defaults.replay is False
    explicit = load(
        "version: 1\ndefaults: {accounting: ZCDP, mechanism: gaussian}\ntables: {t: {public: true}}\n"
    )
    assert (explicit.defaults.accounting, explicit.defaults.mechanism) == ("zcdp", Mechanism.GAUSSIAN)
    pure = load(
        "version: 1\ndefaults: {accounting: pure, mechanism: gaussian}\ntables: {t: {public: true}}\n"
    )
    assert (pure.defaults.accounting, pure.defaults.mechanism) == ("pure", Mechanism.GAUSSIAN)


@pytest.mark.parametrize(
    ("defaults", "path", "fragments"),
    [
        ("accounting: rdp", "defaults.accounting", ("unknown accounting `rdp`", "write pure or zcdp")),
        ("accounting: [zcdp]", "defaults.accounting", ("expected text", "write pure or zcdp")),
        ("acounting: zcdp", "defaults.acounting", ("unknown key", "did you mean `accounting`?")),
        (
            "accounting: zcdp, mechanism: laplace",
            "defaults.mechanism",
            ("laplace noise cannot be charged in ρ", "write `mechanism: gaussian`", "`accounting: pure`"),
        ),
        (
            "accounting: zcdp, delta: 0",
            "defaults.delta",
            ("`accounting: zcdp` needs a delta greater than 0", "set defaults.delta"),
        ),
        (
            "accounting: zcdp, mechanism: gaussian, delta: 0",
            "defaults.delta",
            ("`accounting: zcdp` needs a delta greater than 0", "or use `accounting: pure`"),
        ),
        ("replay: 'yes'", "defaults.replay", ("expected true or false", "without quotes")),
        ("replay: 1", "defaults.replay", ("expected true or false",)),
    ],
)
def test_bad_accounting_and_replay_are_rejected(defaults, path, fragments):
    only_problem(
        f"version: 1\ndefaults: {{{defaults}}}\ntables: {{t: {{public: true}}}}\n", 2, path, *fragments
    )


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("3", 3),
        ("-1", -1),
        ("0", 0),
        ('"3"', "3"),  # text: another epoch than the number 3
        ("2024-06-01", "2024-06-01"),  # an unquoted date is taken as written
        ("june-refresh", "june-refresh"),
        ("'yes'", "yes"),
    ],
)
def test_replay_epoch_is_a_whole_number_or_text(written, expected):
    assert Defaults().data_epoch == 0 and load(TABLE).defaults.data_epoch == 0
    defaults = load(
        f"version: 1\ndefaults: {{data_epoch: {written}}}\ntables: {{t: {{public: true}}}}\n"
    ).defaults
    assert defaults.data_epoch == expected and type(defaults.data_epoch) is type(expected)


@pytest.mark.parametrize(
    "written",
    ["1.5", "1e3", "true", "yes", "null", ".inf", "[1]", "{a: 1}", '""', '"   "', '"' + "x" * 101 + '"'],
)
def test_replay_epoch_bad_values_are_rejected(written):
    text = (
        f"version: 1\ndefaults:\n  epsilon: 0.5\n  data_epoch: {written}\ntables: {{t: {{public: true}}}}\n"
    )
    only_problem(text, 4, "defaults.data_epoch", "whole number", 'text such as "2024-06-01"')


def test_zcdp_problems_name_their_own_lines_and_every_analyst_needs_delta():
    text = """
        version: 1
        defaults:
          accounting: zcdp
          mechanism: laplace
        analysts:
          ann: {epsilon: 10, delta: 1.0e-5}
          bob:
            epsilon: 1
            delta: 0
        tables: {t: {public: true}}
    """
    found = problems(text)
    assert len(found) == 2, "\n".join(found)
    assert_problem(found, 4, "defaults.mechanism", "laplace noise cannot be charged in ρ")
    assert_problem(
        found,
        9,
        "analysts.bob.delta",
        "must be greater than 0 under `accounting: zcdp`",
        "give the analyst a small δ budget such as 1.0e-5",
    )
    # Under pure accounting the same analyst is fine: δ = 0 allows only queries spending no δ.
    assert load(text.replace("accounting: zcdp", "accounting: pure")).analyst("bob").delta == 0.0


# --- analysts ---------------------------------------------------------------------------------


def analyst(spec: str) -> str:
    return f"version: 1\nanalysts:\n  ann: {{{spec}}}\ntables: {{t: {{public: true}}}}\n"


@pytest.mark.parametrize(
    "password",
    ["hunter2-plaintext", "md5a3556571e93b0d20722ba62be61e8c2d", "SCRAM-SHA-256$4096:c2FsdA==$bad:bad"],
)
def test_passwords_must_be_scram_verifiers_and_are_never_echoed(password):
    found = only_problem(analyst(f'password: "{password}", epsilon: 1, delta: 0'), 3, "analysts.ann.password")
    assert "run `dpproxy policy passwd` and paste its output" in found
    assert password not in found


def test_analysts_are_loaded_and_a_password_is_optional():
    text = f"""
        version: 1
        analysts:
          ann: {{password: "{PW_VERIFIER}", epsilon: 10, delta: 1.0e-5, max_epsilon_per_query: 2}}
          cli_only: {{epsilon: 1, delta: 0}}
          later: {{password: null, epsilon: 1, delta: 0}}
        tables: {{t: {{public: true}}}}
    """
    policy = load(text)
    ann = policy.analyst("ann")
    assert ann.password == PW_VERIFIER and parse_verifier(ann.password).matches("pw")
    assert (ann.epsilon, ann.delta, ann.max_epsilon_per_query) == (10.0, 1e-5, 2.0)
    assert PW_VERIFIER not in repr(ann)
    assert policy.analyst("cli_only").password is None
    assert policy.analyst("later").password is None
    assert policy.epsilon_limits(ann) == (0.001, 2.0)


@pytest.mark.parametrize(
    ("spec", "path", "fragment"),
    [
        ("epsilon: 0, delta: 0", "epsilon", "greater than 0"),
        ("epsilon: 1, delta: 1", "delta", "below 1"),
        (
            "epsilon: 1, delta: 0, max_epsilon_per_query: 2",
            "max_epsilon_per_query",
            "greater than the analyst's total",
        ),
        ("epsilon: 1, delta: 0, max_epsilon_per_query: 0", "max_epsilon_per_query", "greater than 0"),
        (
            "epsilon: 1, delta: 0, max_epsilon_per_query: 0.0001",
            "max_epsilon_per_query",
            "below defaults.min_epsilon",
        ),
    ],
)
def test_bad_analyst_budgets_are_rejected(spec, path, fragment):
    only_problem(analyst(spec), 3, f"analysts.ann.{path}", fragment)


# --- all problems at once, files --------------------------------------------------------------


def test_all_problems_are_reported_at_once_in_file_order(tmp_path):
    path = tmp_path / "five.yaml"
    path.write_text(
        yaml_text(
            """
            version: 1
            defaults: {epsilon: 0}
            analysts:
              ann: {password: letmein, epsilon: 1, delta: 0}
            tables:
              t:
                privacy_unit: pid
                columns:
                  pid: {type: integer}
                  age: {type: integer, lower: 0}
                  income: {type: numeric}
                  dx: {type: text, public_values: [a, a]}
            """
        )
    )
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    found = info.value.problems
    assert [p.split(": ")[0] for p in found] == [f"{path}:{line}" for line in (2, 4, 10, 11, 12)]
    assert str(path) in str(info.value) and "5 problem(s)" in str(info.value)
    assert info.value.sqlstate == "F0000"


def test_an_unreadable_file_is_a_policy_error(tmp_path):
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "missing.yaml")
    assert "cannot read the policy file" in info.value.problems[0]


# --- the example policies ---------------------------------------------------------------------


def test_demo_policy_loads_with_the_expected_shape():
    policy = load_policy(POLICIES / "demo.yaml")
    assert [t.name for t in policy.tables] == ["patients", "visits", "zip_info"]
    patients, visits, zip_info = policy.tables
    assert patients.privacy_unit == "patient_id"
    assert (patients.max_groups_per_unit, patients.max_rows_per_unit) == (1, 1)
    assert {c.name: c.type for c in patients.columns} == {
        "patient_id": ColumnType.INTEGER,
        "age": ColumnType.INTEGER,
        "sex": ColumnType.VARCHAR,
        "income": ColumnType.NUMERIC,
        "zip": ColumnType.VARCHAR,
        "diagnosis": ColumnType.VARCHAR,
        "smoker": ColumnType.BOOLEAN,
        "enrolled": ColumnType.DATE,
    }
    assert (patients.column("age").lower, patients.column("age").upper) == (0, 120)
    income = patients.column("income")
    assert (income.lower, income.upper, income.grid_scale) == (0, 500000, 2)
    assert patients.column("sex").public_values == ("F", "M", "X")
    assert patients.column("smoker").public_values == (True, False)
    assert patients.column("zip").public_values is None
    assert len(patients.column("diagnosis").public_values) == 6

    assert visits.privacy_unit == "patient_id"
    assert (visits.max_groups_per_unit, visits.max_rows_per_unit) == (3, 5)
    assert visits.column("visit_id").type is ColumnType.BIGINT and not visits.column("visit_id").summable
    assert (visits.column("cost").lower, visits.column("cost").upper) == (0, 20000)
    assert (visits.column("duration_minutes").lower, visits.column("duration_minutes").upper) == (0, 600)
    assert len(visits.column("department").public_values) == 8
    assert zip_info.public

    alice, bob = policy.analyst("alice"), policy.analyst("bob")
    assert (alice.epsilon, alice.delta, bob.epsilon, bob.delta) == (10.0, 1e-5, 2.0, 1e-6)
    assert parse_verifier(alice.password).matches("alice-demo")
    assert parse_verifier(bob.password).matches("bob-demo")


def test_census_policy_loads_with_the_expected_shape():
    policy = load_policy(POLICIES / "census.yaml")
    (adults,) = policy.tables
    assert adults.name == "adults" and adults.unit_is_row
    assert [c.name for c in adults.columns] == [
        "age", "sex", "education", "hours_per_week", "income_bracket", "capital_gain",
    ]  # fmt: skip
    assert (adults.column("hours_per_week").lower, adults.column("hours_per_week").upper) == (0, 99)
    assert (adults.column("capital_gain").lower, adults.column("capital_gain").upper) == (0, 100000)
    assert adults.column("income_bracket").public_values == ("<=50K", ">50K")
    assert adults.column("education").public_values and adults.column("sex").public_values
    assert len(policy.analysts) == 1


# --- the live schema --------------------------------------------------------------------------


@dataclass(frozen=True)
class Live:
    name: str
    type: ColumnType | None
    sql_type: str


DEMO_LIVE = {
    "patients": [
        Live("patient_id", ColumnType.INTEGER, "INTEGER"),
        Live("age", ColumnType.SMALLINT, "SMALLINT"),  # narrower than the policy: fine
        Live("sex", ColumnType.TEXT, "TEXT"),
        Live("income", ColumnType.NUMERIC, "DECIMAL(12,2)"),
        Live("zip", ColumnType.VARCHAR, "VARCHAR"),
        Live("diagnosis", ColumnType.VARCHAR, "VARCHAR"),
        Live("smoker", ColumnType.BOOLEAN, "BOOLEAN"),
        Live("enrolled", ColumnType.DATE, "DATE"),
        Live("ssn", ColumnType.TEXT, "TEXT"),  # not in the policy: simply not exposed
    ],
    "visits": [
        Live("visit_id", ColumnType.BIGINT, "BIGINT"),
        Live("patient_id", ColumnType.INTEGER, "INTEGER"),
        Live("visit_date", ColumnType.DATE, "DATE"),
        Live("department", ColumnType.VARCHAR, "VARCHAR"),
        Live("cost", ColumnType.NUMERIC, "DECIMAL(10,2)"),
        Live("duration_minutes", ColumnType.INTEGER, "INTEGER"),
    ],
    "zip_info": [Live("zip", ColumnType.VARCHAR, "VARCHAR")],
}


def test_the_demo_policy_matches_the_demo_schema():
    assert check_against_schema(load_policy(POLICIES / "demo.yaml"), DEMO_LIVE) == []


def test_schema_check_finds_missing_tables_columns_and_wrong_types():
    live = {name: list(columns) for name, columns in DEMO_LIVE.items() if name != "zip_info"}
    live["patients"] = [c for c in live["patients"] if c.name != "zip"]
    live["patients"][1] = Live("age", ColumnType.BIGINT, "BIGINT")
    live["patients"][3] = Live("income", ColumnType.DOUBLE, "DOUBLE")
    live["visits"][2] = Live("visit_date", ColumnType.TEXT, "TEXT")
    live["visits"][3] = Live("department", None, "JSON")
    found = check_against_schema(load_policy(POLICIES / "demo.yaml"), live)
    assert len(found) == 6, "\n".join(found)
    text = "\n".join(found)
    assert "tables.zip_info: the database has no table zip_info" in text
    assert "tables.patients.columns.zip: the database table patients has no column zip" in text
    assert "patients.age is BIGINT, wider than the policy's integer; declare `type: bigint`" in text
    assert "patients.income is DOUBLE, wider than the policy's numeric" in text
    assert "visits.visit_date is TEXT, incompatible with the policy's date" in text
    assert "visits.department has type JSON, which dpproxy does not support" in text
    assert all(p.startswith(str(POLICIES / "demo.yaml")) for p in found)


def test_schema_check_finds_schema_qualified_tables():
    policy = load("version: 1\ntables:\n  z: {public: true, schema: ref, columns: {n: {type: bigint}}}\n")
    assert check_against_schema(policy, {"ref.z": [Live("n", ColumnType.INTEGER, "integer")]}) == []
    assert "no table ref.z" in check_against_schema(policy, {})[0]


def test_draft_policy_loads_as_is_and_is_conservative():
    live = {
        **DEMO_LIVE,
        "survey": [Live("answer", ColumnType.TEXT, "TEXT"), Live("score", ColumnType.DOUBLE, "DOUBLE")],
        "odd": [Live("blob", None, "BYTEA")],
        "Mixed": [Live("a", ColumnType.TEXT, "TEXT")],
    }
    draft = draft_policy(live, analyst="ann")
    policy = parse_policy(draft, "draft.yaml")
    assert check_against_schema(policy, live) == []
    assert {t.name for t in policy.tables} == {"patients", "visits", "zip_info", "survey"}
    assert policy.table("patients").privacy_unit == "patient_id"
    assert policy.table("visits").privacy_unit == "patient_id"  # shared with patients
    assert policy.table("survey").unit_is_row
    for table in policy.tables:
        assert not table.public
        assert not any(c.bounded or c.public_values for c in table.columns), table.name
        summable = [c.name for c in table.columns if c.type.is_number and c.summable]
        assert summable in ([], [table.privacy_unit]), table.name
    assert policy.analyst("ann").password is None
    assert "TODO" in draft and "# skipped table Mixed" in draft and "skipped table odd" in draft


def test_draft_policy_loads_after_the_owner_fills_in_bounds():
    draft = draft_policy(DEMO_LIVE)
    lines = []
    for line in draft.splitlines():
        if line.strip().startswith(("age:", "income:")):
            line = line.replace("summable: false", "lower: 0, upper: 100").split("  # TODO")[0]
        lines.append(line)
    patients = parse_policy("\n".join(lines), "draft.yaml").table("patients")
    assert patients.column("age").summable and patients.column("income").upper == 100


# --- SCRAM -------------------------------------------------------------------------------------


def scram_exchange(verifier_text: str, password: str) -> None:
    """A full SCRAM-SHA-256 exchange: scramp's client against scramp's server using our verifier."""
    verifier = parse_verifier(verifier_text)

    def auth_fn(username: str) -> tuple[bytes, bytes, bytes, int]:
        return verifier.salt, verifier.stored_key, verifier.server_key, verifier.iterations

    server = ScramMechanism("SCRAM-SHA-256").make_server(auth_fn)
    client = ScramClient(["SCRAM-SHA-256"], "ann", password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    server.set_client_final(client.get_client_final())
    client.set_server_final(server.get_server_final())  # checks the server's signature


def test_a_verifier_authenticates_a_real_scram_client():
    scram_exchange(PW_VERIFIER, "pw")
    with pytest.raises(ScramException):
        scram_exchange(PW_VERIFIER, "pw2")


def test_saslprep_matches_the_scram_client():
    # U+00AD (soft hyphen) maps to nothing and U+2168 (roman numeral nine) to "IX" under SASLprep.
    verifier = make_verifier("I\u00adX\u2168")
    scram_exchange(verifier, "IXIX")
    assert parse_verifier(verifier).matches("IXIX")


# Made by PostgreSQL 15 (CREATE ROLE ... PASSWORD with password_encryption = scram-sha-256).
POSTGRES_VERIFIERS = {
    "alice-demo": "SCRAM-SHA-256$4096:tPCPIQQJFH4AOjtF9lwD+Q==$cIIBiwGGGFpehg6CuKwRffft7TRNcZitabTOJQyZM58="
    ":YDNea870KjkKNiRDxXUgFTyqB/kf1bbBPqj1c5njeG0=",
    # SASLprep maps the soft hyphen to nothing and NFKC turns U+2168 into "IX".
    "I\u00adX\u2168": (
        "SCRAM-SHA-256$4096:zYZ2cBQB/lR6aYKP2IKnAw==$ge43CjVD/zhWiver3Zw4FFI1wsT3LIF7gxwveEs0W/Y="
        ":WWEz2I07j61ArHycoHYGiyk5HjhV1RlJ5qRg8k3/VjA="
    ),
    # A private-use character is prohibited: PostgreSQL then uses the raw bytes.
    "pri\ue000vate": (
        "SCRAM-SHA-256$4096:Fo4Q0W/NCms9+0VexVdDiQ==$JxQOrDVCsxa+s4+Zt+QkMAEcX+gqM+NczzpmMnrKA70="
        ":ljjjo0R3x+XzBsjBBQUnVIOOrs6ppaHTRLi3nJbvZvU="
    ),
    # Right-to-left text mixed with a left-to-right letter: invalid bidi, raw bytes again.
    "\u0627\u0644a": (
        "SCRAM-SHA-256$4096:x4OSXxaNPyWbKLfDcA0HJg==$zvjfRuuHWzJQlfJmZnbXMZidxnFR4xHvig8jDYNLuwI="
        ":vGaxRvNawbPs9piOcPE7gcGE8IqduWXEkjBMq7+KUs0="
    ),
}


@pytest.mark.parametrize("password", list(POSTGRES_VERIFIERS))
def test_verifiers_are_byte_identical_to_postgresql(password):
    expected = POSTGRES_VERIFIERS[password]
    assert make_verifier(password, salt=parse_verifier(expected).salt) == expected


@settings(max_examples=15)
@given(st.text(min_size=1, max_size=20))
def test_any_password_matches_its_own_verifier_only(password):
    verifier = parse_verifier(make_verifier(password))
    assert verifier.matches(password)
    assert not verifier.matches(password + "x")


@pytest.mark.parametrize(
    "text",
    [
        "hunter2",
        "md5a3556571e93b0d20722ba62be61e8c2d",
        "SCRAM-SHA-1$4096:c2FsdA==$a:b",
        "SCRAM-SHA-256$4096:c2FsdA==$!!!:abc=",
        "SCRAM-SHA-256$0:c2FsdA==$" + "A" * 43 + "=:" + "A" * 43 + "=",
        "SCRAM-SHA-256$4096:c2FsdA==$c2hvcnQ=:c2hvcnQ=",  # keys of the wrong length
    ],
)
def test_malformed_verifiers_are_rejected_without_echo(text):
    assert not is_verifier(text)
    with pytest.raises(ValueError) as info:
        parse_verifier(text)
    assert text not in str(info.value)


def test_verifier_format_and_repr():
    text = make_verifier("pw", salt=b"0123456789abcdef")
    assert text.startswith("SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$")
    verifier = parse_verifier(text)
    assert verifier.to_text() == text and is_verifier(text)
    assert verifier.salt == b"0123456789abcdef" and len(verifier.stored_key) == 32
    assert "MDEy" not in repr(verifier) and text.split("$")[2][:10] not in repr(verifier)
    with pytest.raises(ValueError):
        make_verifier("pw", iterations=1000)
    with pytest.raises(ValueError):
        make_verifier("")


def test_row_bounding_is_clamp_by_default_and_can_sample() -> None:
    base = "version: 1\ntables:\n  t:\n    privacy_unit: pid\n    max_rows_per_unit: 3\n{extra}    columns: {{pid: {{type: integer}}}}\n"
    assert parse_policy(base.format(extra="")).table("t").row_bounding == "clamp"
    assert parse_policy(base.format(extra="    row_bounding: sample\n")).table("t").row_bounding == "sample"
    with pytest.raises(PolicyError) as caught:
        parse_policy(base.format(extra="    row_bounding: drop\n"), source="p.yaml")
    assert "p.yaml:6: tables.t.row_bounding: `drop` is not a row bounding; write clamp or sample" in str(
        caught.value
    )


def test_randomized_response_is_a_table_switch() -> None:
    base = (
        "version: 1\ntables:\n  t:\n    privacy_unit: pid\n{extra}    columns: {{pid: {{type: integer}}}}\n"
    )
    assert parse_policy(base.format(extra="")).table("t").randomized_response is False
    assert parse_policy(base.format(extra="    randomized_response: true\n")).table("t").randomized_response
    with pytest.raises(PolicyError) as caught:
        parse_policy(base.format(extra="    randomized_response: yes please\n"), source="p.yaml")
    assert "p.yaml:5: tables.t.randomized_response: expected true or false" in str(caught.value)
