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

log() { printf '==> %s\n' "$*" >&2; }

# --- 1. Debian packages -------------------------------------------------------------------------
missing=()
for package in "${apt_packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$package")
    fi
done
# Debian splits venv (and its pip) out of python3.
if [[ ! -x .venv/bin/python ]] && ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    missing+=("python3-venv")
fi
if ((${#missing[@]})); then
    if [[ "${DPPROXY_SKIP_APT:-0}" == 1 ]] || ! command -v apt-get >/dev/null; then
        log "not installing missing packages (${missing[*]}): DPPROXY_SKIP_APT=1 or no apt-get"
    else
        sudo=()
        if [[ $(id -u) != 0 ]]; then sudo=(sudo); fi
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        "${sudo[@]}" apt-get update -qq
        "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

# --- 2. virtualenv ------------------------------------------------------------------------------
if [[ ! -x .venv/bin/python ]]; then
    log "creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.dpproxy-installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || "$(cat "$stamp")" != "$wanted" ]] || ! .venv/bin/python -m pip show -q dpproxy >/dev/null 2>&1; then
    log "installing dpproxy[test] into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
    echo "$wanted" >"$stamp"
fi

# --- 3. lint and tests --------------------------------------------------------------------------
log "ruff check"
.venv/bin/ruff check .
log "pytest"
exec .venv/bin/python -m pytest -n auto "$@"
