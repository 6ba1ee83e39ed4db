#!/usr/bin/env bash
# Builds the Heddle images from the release binaries already compiled in
# $CARGO_TARGET_DIR/release (nothing is compiled inside an image):
#
#   heddle-server:$TAG    the API server
#   heddle-agent:$TAG     the node agent, with NCCL, rdma-core, perftest and ucx-utils
#   heddle-postgres:$TAG  Debian's PostgreSQL, for tests and the compose file
#
# Every image starts FROM $HEDDLE_BASE_IMAGE (default debian:bookworm-slim, pinned by the
# digest below: a registry's tag can be pushed again, a digest always names the same
# bytes). When that image is not in the local Docker engine and cannot be pulled (no
# registry reachable), a local base is made instead: `debootstrap --variant=minbase
# bookworm` from $HEDDLE_DEBIAN_MIRROR, checked against Debian's archive keyring (the
# signed Release file carries the hash of every package), imported with `docker import`
# as heddle-base:bookworm. The root file system tarball is cached under
# ~/.cache/heddle-docker/, so only the first run downloads Debian.
#
# NCCL for the agent comes from NVIDIA's wheel on PyPI (nvidia-nccl-cu12, pinned by version
# and hash below), downloaded once into the same cache: the wheel holds libnccl.so.2 only.
#
# Needs: docker, python3-venv (for pip), and debootstrap when the base must be made
# (scripts/setup.sh --test installs them).
# Build the binaries first:  cargo build --release -p heddle-server -p heddle-agent
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$HOME/.cache/heddle-target}
# HEDDLE_BIN_DIR picks other binaries (e.g. a debug build while iterating).
bin=${HEDDLE_BIN_DIR:-$target/release}
tag=${HEDDLE_IMAGE_TAG:-dev}
# debian:bookworm-slim's multi-platform index, as docker-library's repo-info recorded it
# (docs/security.md, "Pinned artefacts", says how to move it on).
base_digest=sha256:abd67ffcfa541b485a3dff59865ab629aa048a6c613e639d36e7456b0b229241
base=${HEDDLE_BASE_IMAGE:-debian:bookworm-slim@$base_digest}
keyring=${HEDDLE_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
mirror=${HEDDLE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${HEDDLE_DOCKER_CACHE:-$HOME/.cache/heddle-docker}
local_base=heddle-base:bookworm
nccl_version=2.27.7
nccl_wheel_sha256=de5ba5562f08029a19cb1cd659404b18411ed0d6c90ac5f52f30bf99ad5809aa

log() { printf 'build-images: %s\n' "$*" >&2; }
t0=$(date +%s)

docker info >/dev/null 2>&1 || { log "the Docker engine does not answer (docker info)"; exit 1; }
[[ "$base" == *@sha256:* ]] \
    || log "warning: $base is not pinned by digest (image@sha256:<digest> always means the same bytes)"

if ! docker image inspect "$base" >/dev/null 2>&1 && ! timeout 60 docker pull -q "$base" >/dev/null 2>&1; then
    log "$base is not available; using a local Debian bookworm base ($local_base)"
    base=$local_base
    if ! docker image inspect "$base" >/dev/null 2>&1; then
        tarball="$cache/bookworm-minbase.tar"
        if [[ ! -s "$tarball" ]]; then
            command -v debootstrap >/dev/null || { log "debootstrap is missing; run: apt-get install debootstrap"; exit 1; }
            # Without a keyring debootstrap only warns and goes on unverified: refuse instead.
            [[ -s "$keyring" ]] || { log "$keyring is missing; run: apt-get install debian-archive-keyring"; exit 1; }
            [[ $(id -u) -eq 0 ]] || { log "debootstrap needs root"; exit 1; }
            mkdir -p "$cache"
            root=$(mktemp -d "$cache/rootfs.XXXXXX")
            trap 'rm -rf "$root"' EXIT
            log "debootstrap --variant=minbase bookworm from $mirror"
            debootstrap --variant=minbase --keyring="$keyring" bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
                || { tail -n 20 "$cache/debootstrap.log" >&2; exit 1; }
            # What the official slim image does too: no caches, no docs, no recommends.
            rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
            printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$root/etc/apt/apt.conf.d/99heddle"
            printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" >"$root/etc/apt/sources.list"
            tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
            mv "$tarball.tmp" "$tarball"
            rm -rf "$root"
            trap - EXIT
        fi
        log "docker import $tarball as $base"
        docker import -c 'CMD ["/bin/bash"]' "$tarball" "$base" >/dev/null
    fi
fi

for b in heddle-server heddle-agent; do
    [[ -x "$bin/$b" ]] || { log "$bin/$b is missing; run: cargo build --release -p heddle-server -p heddle-agent"; exit 1; }
done

nccl_dir="$cache/nccl-$nccl_version"
if [[ ! -s "$nccl_dir/lib/libnccl.so.2" ]]; then
    log "NCCL $nccl_version: pip download nvidia-nccl-cu12==$nccl_version"
    mkdir -p "$cache"
    [[ -x "$cache/pip/bin/pip" ]] || python3 -m venv "$cache/pip" \
        || { log "python3 -m venv failed; run: apt-get install python3-venv"; exit 1; }
    dl=$(mktemp -d "$cache/nccl.XXXXXX")
    trap 'rm -rf "$dl"' EXIT
    printf 'nvidia-nccl-cu12==%s --hash=sha256:%s\n' "$nccl_version" "$nccl_wheel_sha256" >"$dl/req.txt"
    "$cache/pip/bin/pip" download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
        --require-hashes -r "$dl/req.txt" -d "$dl" >&2
    "$cache/pip/bin/python" -m zipfile -e "$dl"/nvidia_nccl_cu12-*.whl "$dl/x"
    mkdir -p "$dl/nccl/lib"
    mv "$dl/x/nvidia/nccl/lib/libnccl.so.2" "$dl/nccl/lib/"
    cp "$dl"/x/nvidia_nccl_cu12-*.dist-info/licenses/License.txt "$dl/nccl/LICENSE.txt"
    rm -rf "$nccl_dir" && mv "$dl/nccl" "$nccl_dir"
    rm -rf "$dl"
    trap - EXIT
fi

# Small build contexts, one per image: what its Dockerfile copies, not the repository.
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/heddle-server" "$ctx/heddle-agent" "$ctx/heddle-postgres"
# Without debug info: a debug build's symbols are hundreds of MB an image need not carry.
slim() { objcopy --strip-debug "$1" "$2" 2>/dev/null || cp "$1" "$2"; }
slim "$bin/heddle-server" "$ctx/heddle-server/heddle-server"
if [[ -d "$repo/frontend/dist" ]]; then cp -r "$repo/frontend/dist" "$ctx/heddle-server/dashboard"; else mkdir "$ctx/heddle-server/dashboard"; fi
slim "$bin/heddle-agent" "$ctx/heddle-agent/heddle-agent"
# NCCL is 400+ MB: a hard link where the cache is on the same file system.
cp -al "$nccl_dir" "$ctx/heddle-agent/nccl" 2>/dev/null || cp -a "$nccl_dir" "$ctx/heddle-agent/nccl"
cp "$repo/docker/postgres-entrypoint.sh" "$ctx/heddle-postgres/"

build() { # image dockerfile
    log "building $1:$tag FROM $base"
    DOCKER_BUILDKIT=0 docker build -q --label io.heddle.build="$1" --build-arg "BASE_IMAGE=$base" \
        -t "$1:$tag" -f "$repo/docker/$2" "$ctx/$1" >/dev/null
}
build heddle-server server.Dockerfile
build heddle-agent agent.Dockerfile
build heddle-postgres postgres.Dockerfile
# The images these tags named before are left without a tag: remove them, not the disk.
docker image prune -f --filter label=io.heddle.build >/dev/null || true
log "done in $(( $(date +%s) - t0 )) s: heddle-server:$tag heddle-agent:$tag (NCCL $nccl_version) heddle-postgres:$tag"
