"""The demo database's live schema as a backend reports it, for schema checks and drafting."""

from __future__ import annotations

from dataclasses import dataclass

from dpproxy.policy import ColumnType


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
