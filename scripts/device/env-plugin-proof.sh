#!/usr/bin/env bash
# On a machine with two GPUs and PyTorch: does a job that sets no NCCL variable run with
# the settings of Heddle's node env file, through libnccl-env-heddle.so, and what does that
# cost? Five runs of scripts/device/env_plugin_job.py (2 processes, one GPU each):
#   stock      no plugin
#   named      NCCL_ENV_PLUGIN=<plugin>, env file sets NCCL_MAX_NCHANNELS=2
#   loader     the plugin as libnccl-env.so on LD_LIBRARY_PATH, no variable set
#   own        as named, but the job sets NCCL_MAX_NCHANNELS=16 itself (the job wins)
#   nofile     as named, the env file missing (stock behaviour, one INFO line says why)
# Usage: scripts/device/env-plugin-proof.sh DIR_WITH_libnccl-env-heddle.so [LOG_DIR]
set -uo pipefail
plugin_dir=$(cd "$1" && pwd); logs=${2:-${OUT:-/tmp}/env-plugin-proof}
mkdir -p "$logs"
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nccl_lib=${NCCL_LIB_DIR:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib}
plugin=$plugin_dir/libnccl-env-heddle.so
[[ -f $plugin ]] || { echo "env-plugin-proof: $plugin is missing" >&2; exit 1; }
envdir=$(mktemp -d /tmp/heddle-env.XXXXXX); chmod 0755 "$envdir"
printf '# written by heddle-agent; do not edit\nNCCL_MAX_NCHANNELS=2\n' > "$envdir/nccl.env"
chmod 0644 "$envdir/nccl.env"
loaderdir=$(mktemp -d /tmp/heddle-loader.XXXXXX); cp "$plugin" "$loaderdir/libnccl-env.so"
port=29700
run() { # name, then env assignments
    local name=$1; shift; port=$((port + 1))
    env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV timeout -k 5 90 \
        python3 "$here/env_plugin_job.py" "$port" > "$logs/$name.log" 2>&1
    local rc=$? fig channels
    fig=$(grep '^{' "$logs/$name.log" | tail -1)
    channels=$(grep -oE 'NCCL INFO Channel [0-9]+/[0-9]+' "$logs/$name.log" | head -1 | sed 's#.*/##')
    printf '%-7s rc=%s channels=%s %s\n' "$name" "$rc" "${channels:-?}" "$fig"
    grep -E 'ENV/Plugin' "$logs/$name.log" | sed 's/^[^ ]* //' | sort | uniq -c | head -6 | sed 's/^/          /'
}
echo "NCCL: $(ls "$nccl_lib" | grep -o 'libnccl.so.2.*' | head -1); env file sha256 $(sha256sum "$envdir/nccl.env" | cut -c1-16)"
run stock
run named NCCL_ENV_PLUGIN="$plugin" HEDDLE_NCCL_ENV_FILE="$envdir/nccl.env"
run loader LD_LIBRARY_PATH="$loaderdir:${LD_LIBRARY_PATH:-}" HEDDLE_NCCL_ENV_FILE="$envdir/nccl.env"
run own NCCL_ENV_PLUGIN="$plugin" HEDDLE_NCCL_ENV_FILE="$envdir/nccl.env" NCCL_MAX_NCHANNELS=16
run nofile NCCL_ENV_PLUGIN="$plugin" HEDDLE_NCCL_ENV_FILE="$envdir/missing.env"
rm -rf "$envdir" "$loaderdir"
