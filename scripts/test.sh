#!/usr/bin/env bash
# The project's test command (README, CI): bash scripts/test.sh [pytest arguments…]
#
# Works on a fresh Debian 12 with Python 3.11, as root or with sudo, reaching only package registries:
#   1. installs the Debian packages the tests need when they are missing (PostgreSQL 15 server and
#      client: the tests start throwaway clusters of their own, no system cluster is used; a JDK and
#      Debian's pgjdbc for the JDBC client test, which fails rather than skips under CI=true;
#      Debian's Chromium and ChromeDriver for the console's browser tests);
#   2. while step 1 runs: creates .venv if missing and installs dpproxy with its test extras into
#      it, again whenever pyproject.toml changes, and the full pyspark of the same release into
#      .spark/ (the Spark Connect server the Spark tests start; Java comes from the JDK of step 1),
#      and dbt-core with dbt-postgres into .dbt/venv (dbt's pins conflict with the test extras');
#   3. runs ruff, then pytest on all cores (pytest-xdist), passing the arguments through.
#
# Environment:
#   DPPROXY_APT_PACKAGES  Debian packages to ensure (default: postgresql-15 postgresql-client-15
#                         default-jdk-headless libpostgresql-jdbc-java chromium chromium-driver)
#   DPPROXY_SKIP_APT=1    never call apt-get (missing packages then make PostgreSQL tests skip or fail)
#   PYTHON                interpreter to create .venv with (default: python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The cluster's server and psql; javac, java and /usr/share/java/postgresql.jar for tests/wire/test_clients.py;
# /usr/bin/chromium and /usr/bin/chromedriver for tests/console/.
DEFAULT_APT_PACKAGES="postgresql-15 postgresql-client-15 default-jdk-headless libpostgresql-jdbc-java chromium chromium-driver"
read -r -a apt_packages <<<"${DPPROXY_APT_PACKAGES:-$DEFAULT_APT_PACKAGES}"
PYTHON=${PYTHON:-python3}

# shellcheck source=scripts/lib.sh
source scripts/lib.sh

# python3-venv first, when Python lacks venv and .venv or dbt's .dbt/venv is to be made; nothing
# otherwise.
VENVS=".venv .dbt/venv" ensure_debian_packages
# The three installs overlap (on a fresh machine they are minutes of downloads): the Debian packages
# and dbt's virtualenv in the background while .venv and the Spark distribution install. A failed
# one stops the script at its `wait`; whichever fails, the script waits for the others before it
# exits (no apt-get or pip left running behind it, e.g. into the .dbt/venv a re-run replaces).
trap 'wait' EXIT
ensure_debian_packages "${apt_packages[@]}" &
apt_job=$!
# dbt-core with dbt-postgres, in a virtualenv of its own (tests/wire/tools/test_dbt.py).
ensure_dbt &
dbt_job=$!
# The test extras: hypothesis, pytest, ruff, the clients the wire tests drive, pyspark-client.
ensure_venv '.[test]'
# The Spark Connect server the Spark tests start (tests/sparkserver.py), from the full pyspark.
ensure_spark_server
wait "$apt_job" || { log "installing the Debian packages failed"; exit 1; }
wait "$dbt_job" || { log "installing dbt into .dbt/venv failed"; exit 1; }
trap - EXIT

# --- 3. lint and tests --------------------------------------------------------------------------
log "ruff check"
.venv/bin/ruff check .
log "pytest"
# The slowest tests are listed at the end, to keep the suite well under 15 minutes on 2 cores.
exec .venv/bin/python -m pytest -n auto --durations=30 "$@"
