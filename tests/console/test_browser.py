"""The console in a real browser (Debian's headless Chromium through its chromedriver): log in,
every page, the planner's slider, a refused login, and no protected value on any page.

Screenshots of each page are saved into $DPPROXY_CONSOLE_SCREENSHOTS, or a temporary directory
whose path is printed. Under CI=true a missing Chromium fails the tests instead of skipping them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import duckdb
import psycopg
import pytest

from dpproxy.console import BackgroundConsole, Console
from dpproxy.engine import Engine
from dpproxy.wire.server import BackgroundServer, ServerConfig
from tests.console.consoles import OWNER, OWNER_PASSWORD

POLICY = Path(__file__).resolve().parent.parent.parent / "policies" / "demo.yaml"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Values planted in the protected table: no page may show them.
PLANTED_INCOME, PLANTED_COST = "271828.17", "31415.93"
# A statement longer than the audit page shows unfolded (console.app.AUDIT_FOLD), its end marked.
LONG_STATEMENT = (
    "SELECT diagnosis, "
    + ", ".join(f"SUM(CASE WHEN age > {a} THEN 1 ELSE 0 END) AS over_{a}" for a in range(20, 80, 5))
    + ", COUNT(*) AS the_end_of_it FROM patients GROUP BY diagnosis"
)


def _browser_or_skip() -> None:
    if os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER):
        return
    message = f"the console's browser tests need {CHROMIUM} and {CHROMEDRIVER} (apt install chromium chromium-driver)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = Path(
        os.environ.get("DPPROXY_CONSOLE_SCREENSHOTS") or tmp_path_factory.mktemp("console-screenshots")
    )
    directory.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots in {directory}")
    return directory


@pytest.fixture(scope="module")
def console(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundConsole]:
    """The demo data with planted values, served; analysts' statements sent over the wire; the
    console reading the same policy and ledger."""
    tmp = tmp_path_factory.mktemp("console-browser")
    backend = tmp / "demo.duckdb"
    shutil.copyfile(demo_duckdb, backend)
    with duckdb.connect(str(backend)) as db:
        db.execute(
            "INSERT INTO patients BY NAME SELECT * REPLACE (patient_id + 1000000 AS patient_id, "
            f"{PLANTED_INCOME} AS income) FROM patients WHERE patient_id % 7 = 0"
        )
        db.execute(
            "INSERT INTO visits BY NAME SELECT * REPLACE (visit_id + 1000000 AS visit_id, "
            f"patient_id + 1000000 AS patient_id, {PLANTED_COST} AS cost) FROM visits WHERE patient_id % 7 = 0"
        )
    engine = Engine.open(POLICY, str(backend), tmp / "ledger.sqlite")
    server = BackgroundServer(engine, ServerConfig(port=0, database="demo"))
    server.start()
    try:
        for user, statements in {
            "alice": [
                "SELECT diagnosis, COUNT(*), AVG(income) FROM patients GROUP BY diagnosis",
                "SELECT department, SUM(cost) FROM visits GROUP BY department",
                "SELECT zip FROM patients",  # refused: raw rows of a protected table
                "SELECT AVG(age) FROM patients WHERE sex = 'F'",
                # A catalog query (shown only when asked for) and a long statement (folded).
                "SELECT relname FROM pg_catalog.pg_class WHERE relkind = 'r' ORDER BY 1",
                LONG_STATEMENT,
            ],
            "bob": ["SELECT COUNT(*) FROM patients", "SELECT smoker, AVG(age) FROM patients GROUP BY smoker"],
        }.items():
            dsn = f"host=127.0.0.1 port={server.port} dbname=demo user={user} password={user}-demo sslmode=disable"
            with psycopg.connect(dsn, autocommit=True) as conn:
                for sql in statements:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute(sql).fetchall()
        assert engine.ledger is not None
        engine.ledger.audit_operator("*", "policy reload accepted (generation 1)", by="tester (SIGHUP)")
        with BackgroundConsole(Console(engine.policy, engine.ledger), port=0) as running:
            yield running
    finally:
        server.stop()
        engine.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", "--window-size=1280,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _log_in(browser, url: str, password: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(url + "login")
    browser.find_element(By.ID, "name").clear()
    browser.find_element(By.ID, "name").send_keys(OWNER)
    browser.find_element(By.ID, "password").send_keys(password)
    browser.find_element(By.ID, "login").click()


def _rows(browser) -> list[str]:
    from selenium.webdriver.common.by import By

    return [r.text for r in browser.find_elements(By.CSS_SELECTOR, "table.audit tbody tr")]


def _no_protected_value(html: str) -> None:
    for planted in (PLANTED_INCOME, PLANTED_COST, "271828", "31415"):
        assert planted not in html


def _full_page(browser, path: Path) -> None:
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(max(height + 40, 700), 4000))
    browser.save_screenshot(str(path))
    browser.set_window_size(1280, 900)


def test_the_console_in_a_browser(console, browser, screenshots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 10)
    _log_in(browser, console.url, "wrong-password")
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".error"))
    assert browser.find_element(By.CSS_SELECTOR, ".error").text == "Wrong name or password."
    assert browser.current_url.endswith("/login")
    assert [c["name"] for c in browser.get_cookies()] == ["dpproxy_login"]  # the form's token, no session
    browser.save_screenshot(str(screenshots / "0-login-refused.png"))

    _log_in(browser, console.url, OWNER_PASSWORD)
    wait.until(lambda b: b.current_url.endswith("/budgets"))
    [cookie] = browser.get_cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert browser.execute_script("return document.cookie") == ""  # out of scripts' reach

    # Budgets: a chart per analyst; alice spent on three private queries.
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline.spent")
    assert len(charts) == 2
    alice = browser.find_element(By.ID, "budget-alice")
    assert float(alice.find_element(By.CSS_SELECTOR, ".spent").text) > 0
    _no_protected_value(browser.page_source)
    _full_page(browser, screenshots / "1-budgets.png")

    # Audit log: every statement, the refused one with its SQLSTATE; filters narrow it.
    browser.find_element(By.LINK_TEXT, "Audit log").click()
    wait.until(lambda b: b.current_url.endswith("/audit"))
    rows = browser.find_elements(By.CSS_SELECTOR, "table.audit tbody tr")
    texts = [r.text for r in rows]
    assert any("SELECT zip FROM patients" in t and "refused" in t for t in texts)
    assert any("SELECT COUNT(*) FROM patients" in t and "bob" in t for t in texts)
    _no_protected_value(browser.page_source)
    _full_page(browser, screenshots / "2-audit.png")
    browser.get(console.url + "audit?analyst=alice&status=refused")
    refused = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "table.audit tbody tr")]
    assert refused and all("alice" in t and "refused" in t for t in refused)
    assert any('raw rows of the protected table "patients"' in t for t in refused)  # the message read
    # Catalog queries only when asked for; the statement column wide; a long statement folded, the
    # whole text a click away; operator actions listed with who did them.
    browser.get(console.url + "audit")
    assert not any("pg_catalog.pg_class" in t for t in _rows(browser))
    table = browser.find_element(By.CSS_SELECTOR, "table.audit")
    statement = browser.find_element(By.CSS_SELECTOR, "table.audit tbody td.sql")
    assert statement.size["width"] > 0.3 * table.size["width"]  # not squeezed (it had ~70 px)
    folded = browser.find_element(By.CSS_SELECTOR, "table.audit td.sql details")
    assert "the_end_of_it" not in folded.text and "show all" in folded.text
    folded.find_element(By.TAG_NAME, "summary").click()
    wait.until(lambda b: "the_end_of_it" in folded.text)
    browser.get(console.url + "audit?kind=catalog")
    catalog = _rows(browser)
    assert (
        catalog and all("catalog" in t for t in catalog) and any("pg_catalog.pg_class" in t for t in catalog)
    )
    browser.get(console.url + "audit?kind=operator")
    operator = _rows(browser)
    assert any("policy reload accepted" in t and "operator tester (SIGHUP)" in t for t in operator)
    assert any("console login from 127.0.0.1" in t and f"operator {OWNER}" in t for t in operator)

    # Policy: bounds and limits, no verifier.
    browser.find_element(By.LINK_TEXT, "Policy").click()
    wait.until(lambda b: b.current_url.endswith("/policy"))
    assert "0 … 500000" in browser.find_element(By.ID, "table-patients").text
    assert "SCRAM-SHA-256$" not in browser.page_source
    _no_protected_value(browser.page_source)
    _full_page(browser, screenshots / "3-policy.png")

    # Planner: AVG(income); moving ε changes the ± without a page load.
    browser.get(console.url + "planner?table=patients&column=income&aggregate=AVG&epsilon=0.1")
    before = browser.find_element(By.ID, "p-error").text
    assert before.startswith("±")
    marker = browser.execute_script("window.stayed = true; return window.stayed")
    slider = browser.find_element(By.ID, "p-epsilon")
    browser.execute_script(
        "arguments[0].value = '0.9'; arguments[0].dispatchEvent(new Event('input'))", slider
    )
    wait.until(lambda b: b.find_element(By.ID, "p-error").text != before)
    after = browser.find_element(By.ID, "p-error").text
    assert float(after.lstrip("±")) < float(before.lstrip("±"))
    assert browser.find_element(By.ID, "p-epsilon-shown").text == "0.9"
    assert marker and browser.execute_script("return window.stayed") is True
    _no_protected_value(browser.page_source)
    _full_page(browser, screenshots / "4-planner.png")

    # Logging out ends the session.
    browser.find_element(By.CSS_SELECTOR, ".logout button").click()
    wait.until(lambda b: b.current_url.endswith("/login"))
    browser.get(console.url + "budgets")
    assert browser.current_url.endswith("/login")
