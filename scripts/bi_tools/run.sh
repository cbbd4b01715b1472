#!/usr/bin/env bash
# Run real BI tools against `dpproxy demo` (README, "BI tools"): bash scripts/bi_tools/run.sh [superset|pgcli|jupysql]…
#
# Each tool is installed from the package registry into its own virtualenv under
# $DPPROXY_BI_CACHE (default ~/.cache/dpproxy/bi_tools; Superset alone is ~1 GB), then driven as a
# user would: Superset through its REST API, pgcli in tmux, jupysql through IPython magics. Every
# step prints PASS or FAIL with the error. Not part of CI (large, slow): run it before releasing
# a change that touches what these tools send. The demo runs with fresh data and ledger in a
# temporary directory, so its budget starts full and nothing of yours is touched.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
HERE=scripts/bi_tools
CACHE=${DPPROXY_BI_CACHE:-$HOME/.cache/dpproxy/bi_tools}
PORT=${DPPROXY_BI_PORT:-6543}
TOOLS=("$@")
((${#TOOLS[@]})) || TOOLS=(superset pgcli jupysql)
mkdir -p "$CACHE"
REPORT=$(mktemp)
exec > >(tee "$REPORT")

log() { printf '==> %s\n' "$*" >&2; }

# venv NAME PACKAGE… — a virtualenv $CACHE/NAME with these packages, installed once.
venv() {
    local name=$1; shift
    local dir=$CACHE/$name stamp="$CACHE/$name/.installed"
    if [[ ! -f $stamp || "$(cat "$stamp")" != "$*" ]]; then
        log "installing $* into $dir"
        python3 -m venv "$dir" || return 1
        "$dir/bin/pip" install -q "$@" >"$CACHE/$name-install.log" 2>&1 || {
            echo "FAIL install $name: $(grep -E 'ERROR|error:' "$CACHE/$name-install.log" | tail -3)"
            return 1
        }
        printf '%s' "$*" >"$stamp"
    fi
    echo "PASS install $name ($("$dir/bin/pip" freeze 2>/dev/null | grep -i -E "^($name|apache[-_]superset)==" | head -1))"
}

[[ -x .venv/bin/dpproxy ]] || { echo "FAIL: .venv/bin/dpproxy missing: run bash scripts/demo.sh once"; exit 1; }
DEMO_DIR=$(mktemp -d)
log "starting dpproxy demo on 127.0.0.1:$PORT (data in $DEMO_DIR)"
# The console on any free port: the README's demo may be running on 6433.
.venv/bin/dpproxy demo --dir "$DEMO_DIR" --port "$PORT" --console-port 0 >"$DEMO_DIR/demo.log" 2>&1 &
DEMO_PID=$!
cleanup() {
    kill "$DEMO_PID" 2>/dev/null
    wait "$DEMO_PID" 2>/dev/null
    [[ -n ${SUPERSET_PID:-} ]] && kill "$SUPERSET_PID" 2>/dev/null
    tmux kill-session -t dpproxy-pgcli 2>/dev/null
    rm -rf "$DEMO_DIR"
    local passed failed
    passed=$(grep -c '^PASS' "$REPORT") failed=$(grep -c '^FAIL' "$REPORT")
    echo "bi_tools: $passed passed, $failed failed"
    rm -f "$REPORT"
    exit $((failed == 0 ? 0 : 1))
}
trap cleanup EXIT
for _ in $(seq 120); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 1
done
(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null || { echo "FAIL demo did not start:"; cat "$DEMO_DIR/demo.log"; exit 1; }
echo "PASS dpproxy demo listening on $PORT"

for tool in "${TOOLS[@]}"; do
    case $tool in
    superset)
        # rich and cachetools: imported by Superset 6.1.0 (its CLI, its engine specs) but not
        # declared; flask-caching 2.5 passes ignore_delete_many_errors, which its cache refuses.
        venv superset "apache-superset==6.1.0" psycopg2-binary rich cachetools "flask-caching<2.5" || continue
        # A fresh metadata database each run (on SQLite, Superset cannot hold two datasets of one
        # table name, even on two connections).
        export SUPERSET_HOME=$DEMO_DIR/superset-home SUPERSET_CONFIG_PATH=$HERE/superset_config.py FLASK_APP=superset
        mkdir -p "$SUPERSET_HOME"
        SS=$CACHE/superset/bin/superset
        { $SS db upgrade && $SS fab create-admin --username admin --firstname a --lastname b \
            --email admin@example.com --password admin && $SS init; } >"$CACHE/superset-setup.log" 2>&1 \
            || { echo "FAIL superset setup: $(tail -3 "$CACHE/superset-setup.log")"; continue; }
        $SS run -h 127.0.0.1 -p 8088 --with-threads >"$CACHE/superset-server.log" 2>&1 &
        SUPERSET_PID=$!
        "$CACHE/superset/bin/python" "$HERE/superset_driver.py" --superset http://127.0.0.1:8088 --port "$PORT"
        kill "$SUPERSET_PID" 2>/dev/null; wait "$SUPERSET_PID" 2>/dev/null; SUPERSET_PID=
        ;;
    pgcli)
        venv pgcli pgcli || continue
        command -v tmux >/dev/null || { echo "FAIL pgcli: tmux is missing (apt-get install tmux)"; continue; }
        bash "$HERE/pgcli_driver.sh" "$CACHE/pgcli/bin/pgcli" "$PORT" "$CACHE/pgcli-home"
        ;;
    jupysql)
        venv jupysql jupysql ipython pandas psycopg2-binary || continue
        "$CACHE/jupysql/bin/python" "$HERE/jupysql_driver.py" --port "$PORT"
        ;;
    *) echo "FAIL unknown tool $tool (superset, pgcli or jupysql)" ;;
    esac
done
