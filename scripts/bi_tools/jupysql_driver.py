"""jupysql against `dpproxy demo` through IPython's magics, as a notebook cell runs them (run by
run.sh with the jupysql virtualenv's Python): `%sql` connect, a query, `%sqlcmd tables`, and a
query into a pandas DataFrame. Prints PASS/FAIL per step."""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any

from IPython.core.interactiveshell import InteractiveShell

results: list[bool] = []


def step(name: str, run: Any) -> Any:
    try:
        value = run()
    except BaseException as exc:
        results.append(False)
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        print(f"FAIL jupysql {name}: {last[:600]}", flush=True)
        return None
    results.append(True)
    print(f"PASS jupysql {name}: {str(value)[:400]!s}", flush=True)
    return value


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "sql")
    shell.run_line_magic("config", "SqlMagic.displaycon = False")
    shell.run_line_magic("config", "SqlMagic.autopandas = False")
    url = f"postgresql+psycopg2://alice:alice-demo@127.0.0.1:{args.port}/demo?sslmode=disable"

    def must(value: Any) -> Any:
        if value is None:
            raise RuntimeError("the magic returned nothing (its error was printed above)")
        return value

    step("connect (%sql URL)", lambda: shell.run_line_magic("sql", url) or "connected")
    step(
        "query (%sql SELECT … GROUP BY)",
        lambda: must(
            shell.run_line_magic("sql", "SELECT diagnosis, COUNT(*) AS n FROM patients GROUP BY diagnosis")
        ),
    )
    step("%sqlcmd tables", lambda: must(shell.run_line_magic("sqlcmd", "tables")))
    step(
        "%sqlcmd columns --table patients",
        lambda: must(shell.run_line_magic("sqlcmd", "columns --table patients")),
    )
    step(
        "query into a DataFrame",
        lambda: (
            must(
                shell.run_line_magic(
                    "sql", "SELECT sex, AVG(income) AS mean_income FROM patients GROUP BY sex"
                )
            )
            .DataFrame()
            .to_dict("records")
        ),
    )
    print(f"jupysql: {results.count(True)} passed, {results.count(False)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
