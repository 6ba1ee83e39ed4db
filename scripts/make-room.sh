#!/usr/bin/env bash
# Makes sure a build and the test suite have disk to work with, and says how much there is.
# Cargo never deletes old artifacts and Docker keeps an image's old layers when a tag moves,
# so a machine that builds Heddle every day fills its disk a little more each time.
#
#   scripts/make-room.sh         # Heddle's own leftovers only
#   scripts/make-room.sh --ci    # also every dangling image, stopped container and unused
#                                # volume of the engine (a machine that only runs Heddle's CI)
#
# In order, until HEDDLE_MIN_FREE_GIB (default 12) are free where the target dir lives:
#   1. images of Heddle's that lost their tag to a newer build (label io.heddle.build);
#   2. cargo's incremental caches (rebuilt as needed, the slowest to lose least);
#   3. the whole target dir ($CARGO_TARGET_DIR): the next build starts from nothing.
set -euo pipefail
target=${CARGO_TARGET_DIR:-$HOME/.cache/heddle-target}
min_gib=${HEDDLE_MIN_FREE_GIB:-12}
log() { printf 'make-room: %s\n' "$*" >&2; }

free_gib() { # path -> whole GiB free on its file system
    local p=$1
    while [[ ! -e "$p" ]]; do p=$(dirname "$p"); done
    df -Pk "$p" | awk 'NR == 2 { printf "%d", $4 / 1048576 }'
}
report() {
    local docker_root=
    docker_root=$(docker info -f '{{.DockerRootDir}}' 2>/dev/null || true)
    log "$1: $(free_gib "$target") GiB free for $target${docker_root:+, $(free_gib "$docker_root") GiB for Docker ($docker_root)}"
}

report "before"
if docker info >/dev/null 2>&1; then
    docker image prune -f --filter label=io.heddle.build >/dev/null || true
    if [[ "${1:-}" == --ci ]]; then
        docker container prune -f >/dev/null || true
        docker image prune -f >/dev/null || true
        docker volume prune -f >/dev/null || true
        docker builder prune -f >/dev/null 2>&1 || true
    fi
fi
if (( $(free_gib "$target") < min_gib )) && [[ -d "$target" ]]; then
    log "under $min_gib GiB free: removing cargo's incremental caches under $target"
    find "$target" -maxdepth 3 -type d -name incremental -prune -exec rm -rf {} +
fi
if (( $(free_gib "$target") < min_gib )) && [[ -d "$target" ]]; then
    log "still under $min_gib GiB free: removing $target (the next build starts from nothing)"
    rm -rf "$target"
fi
report "after"
if (( $(free_gib "$target") < min_gib )); then
    log "warning: under $min_gib GiB free; the build or the images may run out of disk"
fi
