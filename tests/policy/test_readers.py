"""Reading values and keys: unknown keys get the closest known one, wrong value types are named, and
names are SQL identifiers distinct once case is ignored.
"""

from __future__ import annotations

import pytest

from tests.policy.policy_text import assert_problem, only_problem, problems


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


@pytest.mark.parametrize("value", ["1e999999999", "-1e-999999999"])
def test_a_number_far_out_of_any_range_is_a_problem_not_a_crash(value: str) -> None:
    """Decimal reads 1e999999999, but arithmetic on it overflows: `policy check` printed a traceback."""
    text = (
        "version: 1\ntables:\n  t:\n    privacy_unit: row\n    columns:\n"
        f"      a: {{type: numeric, lower: 0, upper: {value}}}\n"
    )
    only_problem(text, 6, "tables.t.columns.a.upper", "far too large or too small")
