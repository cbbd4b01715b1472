"""The schema, policies and adversarial databases the query-language generator runs against.

Demo-like tables: two protected tables sharing the privacy unit (`patients`, `visits`), one whose
person is reached through a foreign key (`visit_notes`: each note belongs to the person of its
visit, `privacy_unit: {references: visits, on: visit_id, key_unique: true}`), a table with one row
per person (`survey`) and a public table (`zip_info`). Every column type the policy
knows appears at least once; dates and times with and without a declared range (whose date_trunc
buckets and extract values are public GROUP BY keys; the ranges hold every generated value but the
infinities and far years, which are read as their ends). The databases are built for attacks, not for realism: values at and
beyond the bounds, NULLs everywhere (keys and units included), zeros, NaN and infinities, empty
and odd strings, one person with very many rows, a person alone in a group no one else is in,
rows whose privacy unit is NULL (nobody's rows), notes of such rows and notes whose visit does not
exist (nobody's either), and an empty database.

The vouch `key_unique: true` is honest: every database keeps visits.visit_id unique and non-NULL
(`check_visit_ids`, called by each database builder).

A *person* is what the neighbour relation adds or removes: a patient id (their rows in `patients`
and `visits`, and the notes of those visits) or one `survey` row (its hidden `rid`).
"""

from __future__ import annotations

import datetime as dt
import math
import random
import re
from dataclasses import dataclass, field
from decimal import Decimal

# Limits small enough that the adversarial persons exceed them (so bounding really happens).
LIMITS = {"patients": (2, 2), "visits": (3, 2), "visit_notes": (4, 2)}
# Limits no generated person reaches, so that no per-person choice (which uses each engine's own
# hash) drops anything: the two backends must then agree exactly. A join's limit is the largest of
# its tables': person 0 has 4032 rows in visit_notes JOIN visits USING (patient_id) JOIN patients.
HIGH_LIMITS = {"patients": (1000, 1000), "visits": (1000, 1000), "visit_notes": (10_000, 1000)}

POLICY_TEMPLATE = """
version: 1
defaults: {{epsilon: 1.0, delta: 1.0e-6}}
tables:
  patients:
    privacy_unit: patient_id
    max_rows_per_unit: {patients_rows}
    max_groups_per_unit: {patients_groups}
    columns:
      patient_id: {{type: integer}}
      age:        {{type: integer, lower: 0, upper: 120}}
      income:     {{type: numeric, lower: 0, upper: 500000, scale: 2}}
      score:      {{type: double precision, lower: -1, upper: 1}}
      zip:        {{type: text}}
      diagnosis:  {{type: text, public_values: [flu, cold, asthma]}}
      birth:      {{type: date}}
      smoker:     {{type: boolean}}
      seen:       {{type: timestamp, lower: 2019-12-31, upper: 2023-12-31}}
  visits:
    privacy_unit: patient_id
    max_rows_per_unit: {visits_rows}
    max_groups_per_unit: {visits_groups}
    columns:
      visit_id:   {{type: bigint, summable: false}}
      patient_id: {{type: integer}}
      cost:       {{type: numeric, lower: 0, upper: 2000, scale: 2}}
      department: {{type: text, public_values: [er, gp, lab]}}
      visit_date: {{type: date, lower: 2021-11-01, upper: 2025-03-31}}
      duration:   {{type: integer, lower: 0, upper: 300}}
      temperature: {{type: real, lower: 30, upper: 45}}
      checked_in: {{type: timestamptz, lower: 2022-09-01 06:00:00+00:00, upper: 2026-06-30}}
  visit_notes:
    privacy_unit: {{references: visits, on: visit_id, key_unique: true}}
    max_rows_per_unit: {notes_rows}
    max_groups_per_unit: {notes_groups}
    columns:
      note_id:    {{type: bigint, summable: false}}
      visit_id:   {{type: bigint, summable: false}}
      words:      {{type: integer, lower: 0, upper: 500}}
      topic:      {{type: text, public_values: [note, lab, scan]}}
      flagged:    {{type: boolean}}
  survey:
    privacy_unit: row
    columns:
      answer: {{type: text, public_values: ['yes', 'no']}}
      rating: {{type: integer, lower: 1, upper: 5}}
  zip_info:
    public: true
    columns:
      zip:        {{type: text}}
      state:      {{type: text}}
      population: {{type: integer}}
"""


def fixed_policy_text(limits: dict[str, tuple[int, int]] = LIMITS) -> str:
    """The policy with `contribution_bounds: fixed` on every table that bounds persons: the limits
    are every query's bounds (counts clamped, an average's sums scaled by r/n on the fine grid)."""
    return re.sub(
        r"\n( +)max_rows_per_unit: (\d+)",
        r"\n\1max_rows_per_unit: \2\n\1contribution_bounds: fixed",
        policy_text(limits),
    )


# The tables whose rows without a person the "each" policy makes persons of their own (a unit
# column of their own: survey's unit is the row, visit_notes' a reference).
EACH_A_PERSON = ("patients", "visits")


def each_a_person_policy_text(limits: dict[str, tuple[int, int]] = LIMITS) -> str:
    """The policy with `null_units: each_a_person` on EACH_A_PERSON: a row whose unit is NULL is a
    person of its own there (rows alike in every listed column one person)."""
    text = policy_text(limits)
    for table in EACH_A_PERSON:
        text = text.replace(f"\n  {table}:\n", f"\n  {table}:\n    null_units: each_a_person\n", 1)
    assert text.count("null_units: each_a_person") == len(EACH_A_PERSON)
    return text


def policy_text(limits: dict[str, tuple[int, int]] = LIMITS) -> str:
    return POLICY_TEMPLATE.format(
        patients_rows=limits["patients"][0],
        patients_groups=limits["patients"][1],
        visits_rows=limits["visits"][0],
        visits_groups=limits["visits"][1],
        notes_rows=limits["visit_notes"][0],
        notes_groups=limits["visit_notes"][1],
    )


# Column order of each table as created; `rid` of survey is not in the policy (never exposed).
TABLES: dict[str, list[tuple[str, str]]] = {
    "patients": [
        ("patient_id", "INTEGER"),
        ("age", "INTEGER"),
        ("income", "NUMERIC(12, 2)"),
        ("score", "DOUBLE PRECISION"),
        ("zip", "VARCHAR"),
        ("diagnosis", "VARCHAR"),
        ("birth", "DATE"),
        ("smoker", "BOOLEAN"),
        ("seen", "TIMESTAMP"),
    ],
    "visits": [
        ("visit_id", "BIGINT"),
        ("patient_id", "INTEGER"),
        ("cost", "NUMERIC(12, 2)"),
        ("department", "VARCHAR"),
        ("visit_date", "DATE"),
        ("duration", "INTEGER"),
        ("temperature", "REAL"),
        ("checked_in", "TIMESTAMPTZ"),
    ],
    "visit_notes": [
        ("note_id", "BIGINT"),
        ("visit_id", "BIGINT"),
        ("words", "INTEGER"),
        ("topic", "VARCHAR"),
        ("flagged", "BOOLEAN"),
    ],
    "survey": [("rid", "INTEGER"), ("answer", "VARCHAR"), ("rating", "INTEGER")],
    "zip_info": [("zip", "VARCHAR"), ("state", "VARCHAR"), ("population", "INTEGER")],
}
# In the order a person's rows are deleted: the notes before the visits they are found by.
PROTECTED = ("patients", "visit_notes", "visits", "survey")

ZIPS = ("00501", "10001", "94103", "", "9", "ZZ", None)
TEXTS = (
    "flu",
    "cold",
    "asthma",
    "Flu",
    " flu ",
    "",
    "%",
    "_x",
    "o'hara",
    "é",
    "É",
    "e\u0301",
    "\tflu",
    "a\\b",
    "none",
    None,
)
DEPARTMENTS = ("er", "gp", "lab", "icu", "ER", "", None)
TOPICS = ("note", "lab", "scan", "Note", "other", "", None)
STATES = ("CA", "NY", "ca", "", None)


@dataclass
class Database:
    """Rows per table; `persons` are the neighbour relation's units (patient ids, then survey rids)."""

    name: str
    rows: dict[str, list[tuple]] = field(default_factory=dict)
    one_row_per_person: bool = False  # as a database enforcing the unit unique would guarantee

    @property
    def patient_ids(self) -> list[int]:
        ids = {r[0] for r in self.rows["patients"]} | {r[1] for r in self.rows["visits"]}
        return sorted(i for i in ids if i is not None)

    @property
    def survey_ids(self) -> list[int]:
        return sorted(r[0] for r in self.rows["survey"])


def _number(rng: random.Random, lo: float, hi: float, *, integral: bool) -> object:
    """A value at, inside or far beyond [lo, hi], zero, or NULL."""
    choice = rng.random()
    if choice < 0.12:
        return None
    if choice < 0.2:
        return 0
    if choice < 0.3:
        return rng.choice((lo, hi))
    if choice < 0.42:
        far = rng.choice((-1, 1)) * rng.choice((10**6, 10**9, 2 * (hi - lo) + 1))
        return int(far) if integral else far + 0.25
    value = rng.uniform(lo, hi)
    return round(value) if integral else round(value, 2)


def _patient(rng: random.Random, pid: int | None) -> tuple:
    income = _number(rng, 0, 500000, integral=False)
    score_choice = rng.random()
    if score_choice < 0.08:
        score: object = rng.choice((math.inf, -math.inf, math.nan))
    else:
        score = _number(rng, -1, 1, integral=False)
        score = None if score is None else float(score) + rng.choice((0.0, 0.125, 1e-9))
    roll = rng.random()
    if roll < 0.1:
        birth: object = None
    elif roll < 0.16:
        # Dates Python cannot hold: read back, cast or extracted from, they would fail.
        birth = rng.choice(("infinity", "-infinity", "12000-01-01", "0001-01-01", "9999-12-31"))
    else:
        birth = dt.date(1930, 1, 1) + dt.timedelta(days=rng.randrange(0, 30000))
    roll = rng.random()
    if roll < 0.1:
        seen: object = None
    elif roll < 0.15:
        seen = rng.choice(("infinity", "-infinity", "15000-06-01 10:00:00"))
    else:
        seen = dt.datetime(2020, 1, 1) + dt.timedelta(
            seconds=rng.randrange(0, 10**8), microseconds=rng.choice((0, 500000, 1))
        )
    return (
        pid,
        _number(rng, 0, 120, integral=True),
        None if income is None else Decimal(str(income)).quantize(Decimal("0.01")),
        score,
        rng.choice(ZIPS),
        rng.choice(TEXTS),
        birth,
        rng.choice((True, False, None)),
        seen,
    )


def _visit(rng: random.Random, vid: int, pid: int | None) -> tuple:
    cost = _number(rng, 0, 2000, integral=False)
    day = None if rng.random() < 0.1 else dt.date(2023, 1, 1) + dt.timedelta(days=rng.randrange(-400, 800))
    temperature = _number(rng, 30, 45, integral=False)
    checked_in = (
        None
        if rng.random() < 0.1
        else dt.datetime(2023, 1, 1, tzinfo=dt.UTC)
        + dt.timedelta(seconds=rng.randrange(-(10**7), 10**8), microseconds=rng.choice((0, 250000)))
    )
    return (
        vid,
        pid,
        None if cost is None else Decimal(str(cost)).quantize(Decimal("0.01")),
        rng.choice(DEPARTMENTS),
        day,
        _number(rng, 0, 300, integral=True),
        None if temperature is None else float(temperature) + rng.choice((0.0, 0.1, 1e-30)),
        checked_in,
    )


def _note(rng: random.Random, nid: int, vid: int | None, topic: str | None = None) -> tuple:
    return (
        None if rng.random() < 0.05 else nid,
        vid,
        _number(rng, 0, 500, integral=True),
        topic if topic is not None else rng.choice(TOPICS),
        rng.choice((True, False, None)),
    )


def _notes(rng: random.Random, visits: list[tuple], orphans: tuple[int | None, ...]) -> list[tuple]:
    """Notes of the visits: up to three each, eight on one of person 0's visits, at least one on each
    visit of person 1 (on a topic of their own, "solo") and of nobody (a NULL patient_id); then orphans,
    whose visit_id finds no visit (or is NULL): they belong to no person."""
    notes: list[tuple] = []
    heavy = next((r[0] for r in visits if r[1] == 0), None)
    for vid, pid, *_ in visits:
        count = 8 if vid == heavy else rng.randrange(1 if pid in (1, None) else 0, 4)
        for _ in range(count):
            notes.append(_note(rng, len(notes) + 1, vid, "solo" if pid == 1 else None))
    for vid in orphans:
        notes.append(_note(rng, len(notes) + 1, vid))
    return notes


def check_visit_ids(db: Database) -> Database:
    """visits.visit_id unique and never NULL, as the policy's `key_unique: true` vouches."""
    ids = [r[0] for r in db.rows["visits"]]
    assert None not in ids and len(set(ids)) == len(ids), f"visit_id not unique in {db.name}"
    return db


def adversarial(seed: int) -> Database:
    """Persons 0…7: #0 with very many rows, #1 alone in its own zip and department, #2 only in
    visits, #3 only in patients, others random; plus rows with a NULL unit, and survey rows; notes
    of the visits (`_notes`), with orphans."""
    rng = random.Random(seed)
    db = Database(f"adversarial-{seed}", {t: [] for t in TABLES})
    visit_id = 0

    def visit(pid: int | None) -> tuple:
        nonlocal visit_id
        visit_id += 1
        return _visit(rng, visit_id, pid)

    for pid in range(8):
        patients = {0: 12, 1: 1, 2: 0, 3: 3}.get(pid, rng.randrange(1, 4))
        visits = {0: 14, 1: 1, 2: 4, 3: 0}.get(pid, rng.randrange(0, 5))
        for _ in range(patients):
            db.rows["patients"].append(_patient(rng, pid))
        for _ in range(visits):
            db.rows["visits"].append(visit(pid))
    # Person 1 alone in a zip and a department of its own: the group appears and vanishes with them.
    db.rows["patients"] = [
        (r[0], r[1], r[2], r[3], "LONELY" if r[0] == 1 else r[4], *r[5:]) for r in db.rows["patients"]
    ]
    db.rows["visits"] = [(*r[:3], "solo" if r[1] == 1 else r[3], *r[4:]) for r in db.rows["visits"]]
    # Dates and times Python cannot hold (±infinity, years past 9999), on rows of persons 4–6.
    extremes = {4: ("infinity", "infinity"), 5: ("12000-01-01", "-infinity"), 6: ("-infinity", "15000-06-01")}
    rows = db.rows["patients"]
    for pid, (birth, seen) in extremes.items():
        i = next(i for i, r in enumerate(rows) if r[0] == pid)
        rows[i] = (*rows[i][:6], birth, rows[i][7], seen)
    # Nobody's rows: a NULL privacy unit.
    db.rows["patients"] += [_patient(rng, None) for _ in range(2)]
    # The last of them twice more, alike in every column: under null_units: each_a_person one
    # person of three rows (more than the row limit), whom a neighbour removes whole.
    db.rows["patients"] += [db.rows["patients"][-1]] * 2
    db.rows["visits"] += [visit(None) for _ in range(2)]
    db.rows["survey"] = [
        (100 + i, rng.choice(("yes", "no", "maybe", None)), _number(rng, 1, 5, integral=True))
        for i in range(6)
    ]
    # The public table: repeated keys (a join may repeat a person's rows), NULLs, the lonely zip.
    db.rows["zip_info"] = [
        ("00501", "NY", 1200),
        ("00501", "ny", 0),
        ("10001", "NY", 21000),
        ("94103", "CA", None),
        ("LONELY", "CA", 7),
        ("", "", 0),
        (None, None, None),
    ]
    # From a generator of their own, so that the other tables keep the rows they had before notes.
    db.rows["visit_notes"] = _notes(
        random.Random(f"notes:{seed}"), db.rows["visits"], (0, 10_001, 10_002, None)
    )
    return check_visit_ids(db)


def empty() -> Database:
    """No person at all; the public table still has rows, and notes of visits that do not exist."""
    db = Database("empty", {t: [] for t in TABLES})
    db.rows["zip_info"] = [("00501", "NY", 1200), ("94103", "CA", 900)]
    db.rows["visit_notes"] = _notes(random.Random("notes:empty"), [], (1, 2, None))
    return check_visit_ids(db)


def one_row_each(seed: int) -> Database:
    """Every person has one row per protected table (agreement without any per-person choice): one
    visit, and one note of it; and one orphan note."""
    rng = random.Random(seed)
    db = Database(f"single-{seed}", {t: [] for t in TABLES}, one_row_per_person=True)
    for pid in range(10):
        db.rows["patients"].append(_patient(rng, pid))
        db.rows["visits"].append(_visit(rng, pid + 1, pid))
    db.rows["survey"] = [
        (100 + i, rng.choice(("yes", "no", None)), _number(rng, 1, 5, integral=True)) for i in range(4)
    ]
    db.rows["zip_info"] = adversarial(seed).rows["zip_info"]
    notes = random.Random(f"notes:single-{seed}")
    db.rows["visit_notes"] = [_note(notes, i + 1, r[0]) for i, r in enumerate(db.rows["visits"])]
    db.rows["visit_notes"].append(_note(notes, len(db.rows["visits"]) + 1, 0))
    return check_visit_ids(db)


def representable_in_spark(db: Database) -> Database:
    """The database with the dates and times Spark cannot hold (±infinity, years past 9999) moved to
    the ends of Spark's range (years 1 and 9999), which every engine holds: the same extremes, loaded
    alike into DuckDB, PostgreSQL and Spark."""
    latest = {"DATE": dt.date(9999, 12, 31), "TIMESTAMP": dt.datetime(9999, 12, 31, 23, 59, 59, 999999)}
    earliest = {"DATE": dt.date(1, 1, 1), "TIMESTAMP": dt.datetime(1, 1, 1)}

    def held(value: object, pg_type: str) -> object:
        if pg_type not in latest or not isinstance(value, str):
            return value
        if value.startswith("-infinity") or value.startswith("0001-"):
            return earliest[pg_type]
        return latest[pg_type]

    rows = {
        table: [
            tuple(held(v, t) for v, (_, t) in zip(row, TABLES[table], strict=True)) for row in db.rows[table]
        ]
        for table in TABLES
    }
    return Database(db.name, rows, db.one_row_per_person)
