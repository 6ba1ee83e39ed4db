# The --bench mode of scripts/device-e2e.sh (sourced): nccl-tests 2.19.6, built here
# against the system NCCL, and `heddle-agent bench nccl` (which loads the same libnccl)
# back to back with the same flags, one process driving both GPUs (-g 2) and, for ours,
# two processes of one GPU each (nccl-tests is built without MPI, so it has no such form).
# Writes $out/bench.txt: per size from 256 MiB, our busbw over nccl-tests', and wall times.
# shellcheck shell=bash
# shellcheck disable=SC2154 # globals of scripts/device-e2e.sh and scripts/device/lib.sh

bench_flags=(-b 8 -e 8G -f 2 -w 5 -n 20)
bench_ops=(all_reduce all_gather reduce_scatter sendrecv)

bench_compare() { # NCCL_TESTS_SRC
    local src=$1 nt="$work/nccl-tests" b="$work/bench" op s
    mkdir -p "$b"
    begin "bench: build nccl-tests"
    [[ -d "$src/src" ]] || die "no nccl-tests sources in $src"
    cp -r "$src" "$nt" && chmod -R u+w "$nt"
    t 600 make -C "$nt" -j16 MPI=0 CUDA_HOME=/usr/local/cuda NCCL_HOME=/usr \
        NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$logs/nccl-tests-build.log" 2>&1 ||
        die "nccl-tests did not build (logs/nccl-tests-build.log)"
    end "$(find "$nt/build" -maxdepth 1 -name "*_perf" | wc -l) programs"

    # Captures for the format test (agent/tests/captures/README.md): nccl-tests' own output
    # with the test's flags, and ours beside it.
    begin "bench: format captures"
    mkdir -p "$out/captures"
    local card
    card=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | awk '{print tolower($NF)}')
    for op in all_gather sendrecv; do
        t 120 "$nt/build/${op}_perf" -g 2 -b 8 -e 128M -f 2 -w 5 -n 20 -G 0 \
            >"$out/captures/nccl_tests_${op}_2gpu_${card:-gpu}.txt" 2>&1 || surprise "${op}_perf (capture) failed"
        t 120 "$bin/heddle-agent" bench nccl "$op" -g 2 -b 8 -e 128M -f 2 -w 5 -n 20 -G 0 \
            >"$out/captures/heddle_bench_${op}_2gpu_${card:-gpu}.txt" 2>&1 || surprise "heddle-agent bench $op (capture) failed"
    done
    end "$(ls "$out/captures" | tr '\n' ' ')"

    for op in "${bench_ops[@]}"; do
        begin "bench: $op"
        s=$(now)
        t 600 "$nt/build/${op}_perf" -g 2 "${bench_flags[@]}" >"$b/nccl-tests-$op.txt" 2>&1 ||
            surprise "${op}_perf failed (bench/nccl-tests-$op.txt)"
        echo "nccl-tests $op -g2 $(secs "$s" "$(now)")" >>"$b/wall.txt"
        s=$(now)
        t 600 "$bin/heddle-agent" bench nccl "$op" -g 2 "${bench_flags[@]}" >"$b/heddle-$op.txt" 2>"$b/heddle-$op.err" ||
            surprise "heddle-agent bench nccl $op -g 2 failed (bench/heddle-$op.err)"
        echo "heddle $op -g2 $(secs "$s" "$(now)")" >>"$b/wall.txt"
        s=$(now)
        local rv="$b/rendezvous-$op" r p=()
        rm -f "$rv"
        for r in 0 1; do
            t 600 "$bin/heddle-agent" bench nccl "$op" -g 1 --nprocs 2 --proc-rank "$r" --rendezvous-file "$rv" \
                "${bench_flags[@]}" >"$b/heddle-2proc-$op.rank$r.txt" 2>"$b/heddle-2proc-$op.rank$r.err" &
            p+=($!)
        done
        wait "${p[0]}" || surprise "heddle-agent bench nccl $op, 2 processes, rank 0 failed"
        wait "${p[1]}" || surprise "heddle-agent bench nccl $op, 2 processes, rank 1 failed"
        echo "heddle $op 2proc $(secs "$s" "$(now)")" >>"$b/wall.txt"
        end "$(tail -n 3 "$b/wall.txt" | awk '{printf "%s %s %ss; ", $1, $3, $4}')"
    done
    python3 "$repo/scripts/device/bench_compare.py" "$b" "${bench_ops[@]}" >"$out/bench.txt" 2>>"$logs/bench-compare.err" ||
        surprise "the comparison could not be made (logs/bench-compare.err)"
    cat "$out/bench.txt" >>"$report"
    cp -r "$b" "$logs/bench"
}
