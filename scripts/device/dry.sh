# The --dry mode of scripts/device-e2e.sh (sourced): everything that needs no GPU, for a
# machine without one. The agents report "no NVML"; GPU tests are skipped with the reason.
# shellcheck shell=bash
# shellcheck disable=SC2154 # globals of scripts/device-e2e.sh and scripts/device/lib.sh

dry_checks() {
    begin "dry: facts"
    t 10 "$bin/heddle" --json nodes show "$node0" >"$runs/node0.json" 2>&1 || surprise "nodes show $node0 failed"
    local nvml
    nvml=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['facts']['nvml']['state'])" "$runs/node0.json" 2>&1)
    end "$node0 NVML: $nvml"

    begin "dry: runs"
    run_watch sleep 60 --kind sleep --nodes "$node0,$node1" --param seconds=0.2 --label "dry sleep"
    expect_succeeded sleep
    run_watch nccl 120 --kind nccl --nodes "$node0,$node1" --param max_bytes=1048576 --label "dry nccl"
    local states
    states=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(sorted({r['outcome'] for r in d['results']})))" "$runs/nccl.json" 2>&1)
    [[ $states == skipped ]] || note "nccl without a GPU: outcomes $states (expected skipped)"
    end "sleep $(verdicts_of sleep); nccl without GPUs: $states"

    begin "dry: mixed channels"
    local profile
    profile=$(create_profile "dry-one-channel" "$node1" NCCL_MAX_NCHANNELS=1)
    mixed_channels_check "$profile"
    delete_profile "$profile"
    end "$mixed_outcome"

    begin "dry: health runs env dashboard"
    cli_ok health 30 health
    cli_ok runs-show 30 runs show "$(run_id sleep)"
    cli_ok "env-$node0" 30 env --explain "$node0"
    dashboard_pages "$(run_id sleep)" ""
    end "$dash_line"
}
