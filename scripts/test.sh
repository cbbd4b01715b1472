#!/usr/bin/env bash
# The project's test command (README, CI): bash scripts/test.sh [pytest arguments…]
#
# Works on a fresh Debian 12 with Python 3.11, as root or with sudo, reaching only package registries:
#   1. installs the Debian packages the tests need when they are missing (PostgreSQL 15 server and
#      client: the tests start throwaway clusters of their own; no system cluster is used);
#   2. creates .venv if missing and installs dpproxy with its test extras into it, again whenever
#      pyproject.toml changes;
#   3. runs ruff, then pytest on all cores (pytest-xdist), passing the arguments through.
#
# Environment:
#   DPPROXY_APT_PACKAGES  Debian packages to ensure (default: postgresql-15 postgresql-client-15)
#   DPPROXY_WITH_JDBC=1   also ensure the JDBC client test's packages (a JDK and the PostgreSQL driver)
#   DPPROXY_SKIP_APT=1    never call apt-get (missing packages then make PostgreSQL tests skip or fail)
#   PYTHON                interpreter to create .venv with (default: python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

POSTGRES_APT_PACKAGES="postgresql-15 postgresql-client-15"
JDBC_APT_PACKAGES="default-jdk-headless libpostgresql-jdbc-java"
read -r -a apt_packages <<<"${DPPROXY_APT_PACKAGES:-$POSTGRES_APT_PACKAGES}"
if [[ "${DPPROXY_WITH_JDBC:-0}" == 1 ]]; then
    read -r -a jdbc_packages <<<"$JDBC_APT_PACKAGES"
    apt_packages+=("${jdbc_packages[@]}")
fi
PYTHON=${PYTHON:-python3}

# shellcheck source=scripts/lib.sh
source scripts/lib.sh

ensure_debian_packages "${apt_packages[@]}"
# The test extras: hypothesis, pytest, ruff, and the clients the wire tests drive.
ensure_venv '.[test]'

# --- 3. lint and tests --------------------------------------------------------------------------
log "ruff check"
.venv/bin/ruff check .
log "pytest"
exec .venv/bin/python -m pytest -n auto "$@"
