"""Drive a running Superset through its REST API against `dpproxy demo` (run by run.sh, with
Superset's own Python): a database connection, datasets, a SQL Lab query, a chart with a time
range, a filter dropdown and a series-limited time series. Prints PASS/FAIL per step, and the SQL
Superset generated for each chart (what tests/wire/tools/test_superset.py replays)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

import requests

TIME_RANGE = "2015-01-01 : 2025-01-01"
results: list[bool] = []


def report(step: str, ok: bool, detail: str = "") -> None:
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} superset {step}" + (f": {detail}" if detail else ""), flush=True)


class Api:
    def __init__(self, base: str) -> None:
        self.base = base
        self.session = requests.Session()

    def login(self) -> None:
        for _ in range(120):  # the dev server takes a while to come up
            try:
                r = self.session.post(
                    f"{self.base}/api/v1/security/login",
                    json={"username": "admin", "password": "admin", "provider": "db", "refresh": True},
                    timeout=10,
                )
                if r.ok:
                    self.session.headers["Authorization"] = f"Bearer {r.json()['access_token']}"
                    return
            except requests.ConnectionError:
                pass
            time.sleep(1)
        raise RuntimeError("Superset did not answer /api/v1/security/login")

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        r = self.session.request(method, f"{self.base}{path}", json=body, timeout=120)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text


def short(value: Any) -> str:
    return json.dumps(value)[:600] if not isinstance(value, str) else value[:600]


def chart_data(api: Api, dataset: int, query: dict[str, Any], step: str) -> None:
    context = {
        "datasource": {"id": dataset, "type": "table"},
        "force": True,
        "queries": [query],
        "result_format": "json",
        "result_type": "full",
    }
    status, body = api.call("POST", "/api/v1/chart/data", context)
    sql = api.call("POST", "/api/v1/chart/data", {**context, "result_type": "query"})[1]
    with contextlib.suppress(KeyError, IndexError, TypeError):
        print(f"     SQL: {sql['result'][0]['query']!r}")
    ok = status == 200 and not body["result"][0].get("error")
    detail = (
        f"{body['result'][0]['rowcount']} rows: {short(body['result'][0]['data'][:5])}" if ok else short(body)
    )
    report(step, ok, detail)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--superset", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    api = Api(args.superset)
    try:
        api.login()
        report("login", True)
    except RuntimeError as exc:
        report("login", False, str(exc))
        return 1
    uri = f"postgresql+psycopg2://alice:alice-demo@127.0.0.1:{args.port}/demo?sslmode=disable"
    status, body = api.call("POST", "/api/v1/database/test_connection/", {"sqlalchemy_uri": uri})
    report("test connection", status == 200, "" if status == 200 else short(body))
    status, body = api.call(
        "POST",
        "/api/v1/database/",
        {"database_name": f"dpproxy demo {time.time():.0f}", "sqlalchemy_uri": uri, "expose_in_sqllab": True},
    )
    if status != 201:
        report("create database", False, short(body))
        return 1
    database = body["id"]
    report("create database", True, f"id {database}")
    datasets: dict[str, int] = {}
    for table in ("patients", "visits"):
        status, body = api.call(
            "POST", "/api/v1/dataset/", {"database": database, "schema": "public", "table_name": table}
        )
        if status == 201:
            datasets[table] = body["id"]
        report(f"create dataset {table}", status == 201, short(body) if status != 201 else f"id {body['id']}")
    status, body = api.call(
        "POST",
        "/api/v1/sqllab/execute/",
        {
            "database_id": database,
            "schema": "public",
            "sql": "SELECT diagnosis, COUNT(*) AS n FROM patients GROUP BY diagnosis",
            "runAsync": False,
        },
    )
    ok = status == 200 and body.get("status") == "success"
    report("SQL Lab query", ok, short(body.get("data") if ok else body))
    if "patients" in datasets:
        patients = datasets["patients"]
        chart_data(
            api,
            patients,
            {
                "columns": [
                    {
                        "timeGrain": "P1Y",
                        "columnType": "BASE_AXIS",
                        "sqlExpression": "enrolled",
                        "label": "enrolled",
                    }
                ],
                "metrics": ["count"],
                "filters": [{"col": "enrolled", "op": "TEMPORAL_RANGE", "val": TIME_RANGE}],
                "orderby": [["count", False]],
                "row_limit": 10000,
            },
            "chart with a time range (bar chart, enrolled by year)",
        )
        status, body = api.call("GET", f"/api/v1/datasource/table/{patients}/column/diagnosis/values/")
        report("filter dropdown values (diagnosis)", status == 200, short(body))
    if "visits" in datasets:
        chart_data(
            api,
            datasets["visits"],
            {
                "columns": [
                    {
                        "timeGrain": "P1Y",
                        "columnType": "BASE_AXIS",
                        "sqlExpression": "visit_date",
                        "label": "visit_date",
                    },
                    "department",
                ],
                "series_columns": ["department"],
                "series_limit": 5,
                "series_limit_metric": "count",
                "metrics": ["count"],
                "filters": [{"col": "visit_date", "op": "TEMPORAL_RANGE", "val": TIME_RANGE}],
                "orderby": [["count", False]],
                "row_limit": 10000,
            },
            "series-limited time series (visits by department, top 5)",
        )
    print(f"superset: {results.count(True)} passed, {results.count(False)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
