#!/usr/bin/env bash
# The project's first command (README): bash scripts/demo.sh [dpproxy demo options…]
#
# On a fresh Debian 12 with Python 3.11: installs dpproxy into .venv (and python3-venv if Python
# lacks it), then runs `dpproxy demo`, which builds 100,000 generated persons on first use and
# serves them on embedded DuckDB at 127.0.0.1:6432 for psql and any PostgreSQL client.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

ensure_debian_packages
ensure_venv '.'
exec .venv/bin/dpproxy demo "$@"
