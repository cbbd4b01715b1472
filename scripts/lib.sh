# Shared by scripts/demo.sh and scripts/test.sh (sourced, not run): install what dpproxy needs on a
# fresh Debian 12 with Python 3.11, as root or with sudo, reaching only the package registries.

log() { printf '==> %s\n' "$*" >&2; }

# ensure_debian_packages PKG… — apt-get install the packages that are missing (and python3-venv
# when Python cannot make a virtualenv and one of VENVS, default .venv, is still to be made).
# DPPROXY_SKIP_APT=1 never calls apt-get.
ensure_debian_packages() {
    local missing=() package
    for package in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$package")
        fi
    done
    # Debian splits venv (and its pip) out of python3.
    local venv to_make=0
    for venv in ${VENVS:-.venv}; do
        [[ -x $venv/bin/python ]] || to_make=1
    done
    if ((to_make)) && ! "${PYTHON:-python3}" -c 'import ensurepip, venv' 2>/dev/null; then
        missing+=("python3-venv")
    fi
    ((${#missing[@]})) || return 0
    if [[ "${DPPROXY_SKIP_APT:-0}" == 1 ]] || ! command -v apt-get >/dev/null; then
        log "not installing missing packages (${missing[*]}): DPPROXY_SKIP_APT=1 or no apt-get"
        return 0
    fi
    local sudo=()
    if [[ $(id -u) != 0 ]]; then sudo=(sudo); fi
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ensure_venv SPEC — create .venv if missing and pip install SPEC (e.g. -e '.[test]') into it,
# again whenever pyproject.toml or SPEC changes.
ensure_venv() {
    local spec=$1
    if [[ ! -x .venv/bin/python ]]; then
        log "creating .venv with $("${PYTHON:-python3}" --version)"
        "${PYTHON:-python3}" -m venv .venv
    fi
    local stamp=.venv/.dpproxy-installed wanted
    wanted="$(sha256sum pyproject.toml | cut -d' ' -f1) $spec"
    if [[ ! -f $stamp || "$(cat "$stamp")" != "$wanted" ]] || ! .venv/bin/python -m pip show -q dpproxy >/dev/null 2>&1; then
        log "installing dpproxy ($spec) into .venv"
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
        echo "$wanted" >"$stamp"
    fi
}

# ensure_spark_server — install the full pyspark package (the Spark Connect server's jars and
# bin/spark-submit) into .spark/pyspark-VERSION, VERSION being that of the pyspark-client in .venv,
# so the tests' local Connect server and dpproxy's client speak the same release. Kept out of .venv:
# pyspark and pyspark-client both install the `pyspark` package.
ensure_spark_server() {
    local version
    version="$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pyspark-client"))')"
    if [[ ! -x .spark/pyspark-$version/pyspark/bin/spark-submit ]]; then
        log "installing the Spark $version distribution (pyspark) into .spark/pyspark-$version"
        rm -rf ".spark/pyspark-$version.partial"
        .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
            --target ".spark/pyspark-$version.partial" "pyspark==$version"
        mv ".spark/pyspark-$version.partial" ".spark/pyspark-$version"
    fi
}

# ensure_dbt — install dbt-core with its PostgreSQL adapter into a virtualenv of its own, .dbt/venv
# (tests/wire/tools/test_dbt.py runs .dbt/venv/bin/dbt against the proxy). Kept out of .venv: dbt
# pins protobuf below the release pyspark-client's gRPC stubs use. dbt-core 1.11 is the last line
# that installs from PyPI alone (2.x builds a parser fetched from GitHub).
DBT_REQUIREMENTS="dbt-core>=1.11,<1.12 dbt-postgres>=1.9,<1.12"
ensure_dbt() {
    local stamp=.dbt/venv/.dpproxy-installed
    if [[ -f $stamp && "$(cat "$stamp")" == "$DBT_REQUIREMENTS" && -x .dbt/venv/bin/dbt ]]; then
        return 0
    fi
    log "installing $DBT_REQUIREMENTS into .dbt/venv"
    rm -rf .dbt/venv
    "${PYTHON:-python3}" -m venv .dbt/venv
    # shellcheck disable=SC2086 # the requirements are words
    .dbt/venv/bin/python -m pip install --quiet --disable-pip-version-check $DBT_REQUIREMENTS
    echo "$DBT_REQUIREMENTS" >"$stamp"
}
