#!/usr/bin/env bash
# A Phorge + Arcanist checkout for the real-Phorge tests (tests/phorge) and
# bench/phorge.py, at the commits pinned in phorge/tested-with:
#
#   scripts/phorge-checkout.sh [--phorge GIT] [--arcanist GIT] [--print-path] [--quiet]
#
#   --phorge GIT, --arcanist GIT  where to get them: a URL or a local git
#           directory (a bare repository or a working copy). Default: the
#           public repositories. A machine without network can be handed a
#           local copy this way.
#   --print-path  print the checkout's Phorge root if it is already there
#           (exit 0), or nothing (exit 1); never fetches anything.
#   --quiet       no progress lines, only the one line of a failure.
#
# The checkout goes to a per-user cache outside the repository:
# ${GORGE_PHORGE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gorge}/phorge-<commit>/{phorge,arcanist}
# (the tests need arcanist/ beside phorge/). It is made in a temporary
# directory and moved into place whole, so an interrupted run leaves nothing
# half-made. Prints the Phorge root on success.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../phorge/tested-with
. "$ROOT/phorge/tested-with"

phorge_src=https://github.com/phorgeit/phorge.git
arcanist_src=https://github.com/phorgeit/arcanist.git
print_path=0
quiet=0
while [ "$#" -gt 0 ]; do
    case "$1" in
        --phorge) phorge_src="${2:?--phorge needs a URL or a git directory}"; shift 2 ;;
        --arcanist) arcanist_src="${2:?--arcanist needs a URL or a git directory}"; shift 2 ;;
        --print-path) print_path=1; shift ;;
        --quiet) quiet=1; shift ;;
        *) echo "phorge-checkout: unknown option $1 (see the head of $0)" >&2; exit 2 ;;
    esac
done

cache="${GORGE_PHORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gorge}"
target="$cache/phorge-${PHORGE_COMMIT:0:10}"

complete() {
    [ -f "$target/phorge/bin/storage" ] && [ -f "$target/arcanist/bin/arc" ] &&
        [ "$(git -C "$target/phorge" rev-parse HEAD 2>/dev/null)" = "$PHORGE_COMMIT" ] &&
        [ "$(git -C "$target/arcanist" rev-parse HEAD 2>/dev/null)" = "$ARCANIST_COMMIT" ]
}

if complete; then
    echo "$target/phorge"
    exit 0
fi
[ "$print_path" = 1 ] && exit 1

say() { [ "$quiet" = 1 ] || echo "phorge-checkout: $*" >&2; }
command -v git >/dev/null 2>&1 || { echo "phorge-checkout: git is not installed" >&2; exit 1; }

# A local directory is read through file:// so that a shallow fetch of one
# commit works for a bare repository and a working copy alike.
source_url() {
    if [ -d "$1" ]; then
        echo "file://$(cd "$1" && pwd)"
    else
        echo "$1"
    fi
}

# One commit, without history: a shallow fetch of the commit itself, or a
# full fetch where the server does not serve commits by id.
get() { # name source commit destination
    local name="$1" url dest="$4"
    url="$(source_url "$2")"
    say "fetching $name $3 from $2"
    git init -q "$dest"
    # No prompt for credentials: an unreachable source fails at once.
    if ! GIT_TERMINAL_PROMPT=0 git -C "$dest" fetch -q --depth 1 "$url" "$3" 2>/dev/null; then
        GIT_TERMINAL_PROMPT=0 git -C "$dest" fetch -q "$url" 'refs/heads/*:refs/remotes/source/*' ||
            return 1
    fi
    git -C "$dest" -c advice.detachedHead=false checkout -q "$3" 2>/dev/null || {
        echo "phorge-checkout: $2 has no commit $3 ($name)" >&2
        return 1
    }
}

mkdir -p "$cache"
work="$(mktemp -d "$cache/.phorge-checkout.XXXXXX")"
trap 'rm -rf "$work"' EXIT
if ! get phorge "$phorge_src" "$PHORGE_COMMIT" "$work/phorge" ||
    ! get arcanist "$arcanist_src" "$ARCANIST_COMMIT" "$work/arcanist"; then
    echo "phorge-checkout: could not get Phorge $PHORGE_COMMIT and Arcanist $ARCANIST_COMMIT" \
        "(from $phorge_src and $arcanist_src); give local copies with --phorge DIR --arcanist DIR" >&2
    exit 1
fi
rm -rf "$target"
mv "$work" "$target"
trap - EXIT
say "checked out into $target"
echo "$target/phorge"
