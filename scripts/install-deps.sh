#!/usr/bin/env bash
# Make this machine ready to run gorge, on Debian (as root):
#
#   scripts/install-deps.sh [--demo|--test] [--print-packages]
#
#   --demo  (what ./scripts/demo.sh asks for) a Python >= 3.11 with venv
#           support and .venv with gorge installed editable (compat mode, so
#           twistd sees twisted/plugins), plus a fresh twistd plugin cache;
#   --test  (the default; what ./scripts/test.sh asks for) the same with the
#           [test] extra, plus the MariaDB and Redis server binaries: the tests
#           start throwaway instances of their own on random loopback ports,
#           the system services the packages ship are never used.
#   --print-packages  print the Debian packages the mode needs, one a line,
#           and exit without installing anything.
#
#   With a Phorge checkout for the real-Phorge tests in tests/phorge
#   (GORGE_PHORGE_ROOT, or the pinned one scripts/phorge-checkout.sh keeps in
#   the per-user cache), --test also installs PHP's command line and the
#   extensions Phorge needs, and Debian's chromium, the headless browser the
#   console's browser test drives through Playwright (no browser download).
#   --test also installs Debian's prometheus for its promtool, which checks
#   and unit-tests the alert rules in conf/prometheus/ (its service is never
#   started, like the database servers').
#
# Idempotent: when everything is in place it only checks and returns.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GORGE_VENV:-$ROOT/.venv}"
STAMP="$VENV/.gorge-install-stamp"

say() { echo "install-deps: $*" >&2; }

mode=test
print_packages=0
for arg in "$@"; do
    case "$arg" in
        --demo) mode=demo ;;
        --test) mode=test ;;
        --print-packages) print_packages=1 ;;
        *) say "unknown option $arg (expected --demo, --test or --print-packages)"; exit 2 ;;
    esac
done

have_cmd() {
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/local/sbin/$1" ]
}

# A Python >= 3.11 that can create a venv with pip in it.
find_python() {
    local py
    for py in python3 python3.13 python3.12 python3.11; do
        if command -v "$py" >/dev/null 2>&1 &&
            "$py" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
            command -v "$py"
            return 0
        fi
    done
    return 1
}

# The PHP command line with the extensions Phorge loads.
php_works() {
    command -v php >/dev/null 2>&1 &&
        php -r 'foreach (["mysqli", "curl", "mbstring", "dom", "zip", "gd", "intl"] as $e) { if (!extension_loaded($e)) { exit(1); } }' >/dev/null 2>&1
}

have_phorge() {
    [ -n "${GORGE_PHORGE_ROOT:-}" ] || bash "$ROOT/scripts/phorge-checkout.sh" --print-path >/dev/null 2>&1
}

venv_works() {
    [ -x "$VENV/bin/python" ] &&
        "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
}

# --- Debian packages ----------------------------------------------------------

php_packages=(php-cli php-mysql php-curl php-mbstring php-xml php-zip php-gd php-intl)
# The browser tests/phorge/test_console_browser.py drives (Playwright with
# executable_path=/usr/bin/chromium).
browser_packages=(chromium)
# promtool, for tests/repo/test_monitoring.py.
monitoring_packages=(prometheus)

if [ "$print_packages" = 1 ]; then
    echo python3
    echo python3-venv
    if [ "$mode" = test ]; then
        echo mariadb-server
        echo redis-server
        printf '%s\n' "${monitoring_packages[@]}"
        if have_phorge; then
            printf '%s\n' "${php_packages[@]}" "${browser_packages[@]}"
        fi
    fi
    exit 0
fi

packages=()
if [ "$mode" = test ]; then
    have_cmd mariadbd && have_cmd mariadb-install-db || packages+=(mariadb-server)
    have_cmd redis-server || packages+=(redis-server)
    have_cmd promtool || packages+=("${monitoring_packages[@]}")
fi
if ! venv_works && ! find_python >/dev/null; then
    packages+=(python3 python3-venv)
fi
if [ "$mode" = test ] && have_phorge && ! php_works; then
    packages+=("${php_packages[@]}")
fi
if [ "$mode" = test ] && have_phorge && ! [ -x /usr/bin/chromium ]; then
    packages+=("${browser_packages[@]}")
fi

if [ "${#packages[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        say "missing ${packages[*]} and no apt-get here; install them by hand"
        exit 1
    fi
    SUDO=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || { say "need root to install ${packages[*]}"; exit 1; }
        SUDO=(sudo)
    fi
    # Keep apt from starting the packaged mariadb/redis/prometheus services: we never use
    # them, and on a small machine they only take memory. Debian's
    # policy-rc.d convention (exit 101 = "do not start") does exactly that;
    # an existing policy is left as it is.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
        "${SUDO[@]}" chmod 755 "$policy"
        trap '"${SUDO[@]}" rm -f "$policy"' EXIT
    fi
    say "installing ${packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

# --- virtualenv and the package -----------------------------------------------

if ! venv_works; then
    python="$(find_python)" || { say "no Python >= 3.11 with venv support found"; exit 1; }
    say "creating $VENV with $python"
    rm -rf "$VENV"
    "$python" -m venv "$VENV"
fi

# Reinstall only when the dependency declaration, the checkout or the mode
# moved. A venv set up for the tests serves the demo as it is.
if [ "$mode" = test ]; then
    target="${ROOT}[test]"
    probe='import gorge, pytest, pytest_twisted, hypothesis'
else
    target="$ROOT"
    probe='import gorge'
fi
wanted="$(cd "$ROOT" && sha256sum pyproject.toml | cut -d' ' -f1) $ROOT"
stamp="$(cat "$STAMP" 2>/dev/null || true)"
if { [ "$stamp" != "$wanted test" ] && [ "$stamp" != "$wanted $mode" ]; } ||
    ! (cd / && "$VENV/bin/python" -c "$probe") >/dev/null 2>&1; then
    say "installing gorge (editable, for the $mode) into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        -e "$target" --config-settings editable_mode=compat
    echo "$wanted $mode" >"$STAMP"
fi

# twistd reads its plugin list from dropin.cache files; rebuild them so a new
# or changed plugin module is seen (and the cache is writable now, as root).
(cd "$ROOT" && "$VENV/bin/python" -c \
    'from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))')
