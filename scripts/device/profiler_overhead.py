#!/usr/bin/env python3
"""What Heddle's NCCL profiler plugin costs a job, and whether it counts what the job did.

Runs a data-parallel-like loop of all_reduce and all_gather over several sizes on 2 GPUs
(NCCL backend), timing each size itself (the median of several batches), and prints one
JSON document: per size the time per operation and bus bandwidth, and per collective
every operation and byte the job issued (warm-up included), with each rank's pid so the
plugin's spool files can be matched (scripts/device/profiler_compare.py).

Run it twice on the same machine, without and with the plugin:

    python3 profiler_overhead.py --out without.json
    NCCL_PROFILER_PLUGIN=/path/libnccl-profiler-heddle.so HEDDLE_PROFILER_SPOOL=/tmp/spool \\
        python3 profiler_overhead.py --out with.json
    python3 profiler_compare.py --job with.json --spool /tmp/spool --baseline without.json

Starts its own 2 processes (torch.multiprocessing) unless started by torchrun (RANK,
WORLD_SIZE and LOCAL_RANK set), in which case each process runs one rank and rank 0
prints its own figures only.
Bytes are counted as NCCL counts them: count x datatype size of the call, which for
all_gather is each rank's input.
"""

import argparse
import json
import os
import sys
import time

SIZES = "8,1K,64K,1M,16M,256M,1G"


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1] in mult:
        return int(s[:-1]) * mult[s[-1]]
    return int(s)


def parse_cpus(spec):
    cpus = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def iters_for(size, scale):
    if size <= 1 << 20:
        n = 200
    elif size <= 16 << 20:
        n = 50
    elif size <= 256 << 20:
        n = 20
    else:
        n = 10
    return max(1, int(n * scale))


def band(nbytes):
    return 0 if nbytes <= 1 else nbytes.bit_length() - 1


def run_rank(rank, world, args, results):
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.one_gpu:
        # Every rank on GPU 0, each its own NCCL host: a two-"node" job over sockets.
        os.environ["NCCL_HOSTID"] = f"ab-host-{rank}"
    if args.pin_cpus:
        groups = args.pin_cpus.split(":")
        os.sched_setaffinity(0, parse_cpus(groups[local % len(groups)]))
    if args.one_gpu:
        local = 0
    torch.cuda.set_device(local)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    dev = torch.device("cuda", local)
    issued = {}

    def count(func, nbytes):
        key = (func, band(nbytes))
        ops, total = issued.get(key, (0, 0))
        issued[key] = (ops + 1, total + nbytes)

    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        numel = max(1, size // 4)
        nbytes = numel * 4
        grads = torch.ones(numel, dtype=torch.float32, device=dev)
        gathered = torch.empty(numel * world, dtype=torch.float32, device=dev)
        n = iters_for(size, args.scale)
        for func in ("AllReduce", "AllGather"):

            def once():
                if func == "AllReduce":
                    dist.all_reduce(grads)
                else:
                    dist.all_gather_into_tensor(gathered, grads)
                count(func, nbytes)

            for _ in range(args.warmup):
                once()
            torch.cuda.synchronize()
            # Several timed batches; the median batch resists a stray slow one (small sizes
            # vary by tens of percent between batches on a shared host).
            batches = []
            for _ in range(args.batches):
                t0 = time.perf_counter()
                for _ in range(n):
                    once()
                torch.cuda.synchronize()
                batches.append((time.perf_counter() - t0) / n)
            mean = sum(batches) / len(batches)
            batches.sort()
            per_op = batches[len(batches) // 2]
            # nccl-tests' convention: all_gather moves size x world bytes in total.
            moved = nbytes * (world if func == "AllGather" else 1)
            algbw = moved / per_op / 1e9
            factor = 2 * (world - 1) / world if func == "AllReduce" else (world - 1) / world
            rows.append(
                {
                    "func": func,
                    "bytes": nbytes,
                    "size_band": band(nbytes),
                    "iters": n,
                    "batches": args.batches,
                    "us_per_op": per_op * 1e6,
                    "us_per_op_min": batches[0] * 1e6,
                    # The mean over every batch: what a setting on for part of the time
                    # (the plugin's sampled kernel events) costs over a long run.
                    "us_per_op_mean": mean * 1e6,
                    "algbw_GBps": algbw,
                    "busbw_GBps": algbw * factor,
                }
            )
        del grads, gathered
    torch.cuda.synchronize()
    mine = {
        "rank": rank,
        "pid": os.getpid(),
        "results": rows,
        "issued": [
            {"func": f, "size_band": b, "ops": o, "bytes": t}
            for (f, b), (o, t) in sorted(issued.items())
        ],
    }
    if args.destroy:
        dist.destroy_process_group()
    results.put(mine) if results is not None else None
    return mine


def child(rank, world, args, queue):
    run_rank(rank, world, args, queue)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=SIZES, help=f"comma-separated sizes in bytes, K/M/G allowed (default {SIZES})")
    p.add_argument("--warmup", type=int, default=5, help="untimed operations per size and collective")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the timed iterations per size")
    p.add_argument("--batches", type=int, default=5,
                   help="timed batches per size and collective; the median batch is reported")
    p.add_argument("--pin-cpus", help="cores per local rank, ':'-separated, e.g. 0-7:64-71 "
                   "(small-message latency varies widely between unpinned processes)")
    p.add_argument("--one-gpu", action="store_true",
                   help="every rank on GPU 0 with its own NCCL_HOSTID (a two-node job over sockets)")
    p.add_argument("--port", type=int, default=29533, help="rendezvous port when starting its own processes")
    p.add_argument("--no-destroy", dest="destroy", action="store_false",
                   help="exit without destroy_process_group (the plugin then writes at exit, not at finalize)")
    p.add_argument("--out", help="write the JSON here as well as to stdout")
    args = p.parse_args()

    import torch

    meta = {
        "torch": torch.__version__,
        "nccl": ".".join(str(x) for x in torch.cuda.nccl.version()),
        "gpu": torch.cuda.get_device_name(0),
        "profiler_plugin": os.environ.get("NCCL_PROFILER_PLUGIN"),
        "spool": os.environ.get("HEDDLE_PROFILER_SPOOL"),
    }
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        mine = run_rank(rank, world, args, None)
        ranks = [mine]
        if rank != 0:
            return
    else:
        import torch.multiprocessing as mp

        world = 2
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=child, args=(r, world, args, queue)) for r in range(world)]
        for pr in procs:
            pr.start()
        ranks = [queue.get() for _ in procs]
        for pr in procs:
            pr.join()
            if pr.exitcode != 0:
                sys.exit(f"rank process exited with {pr.exitcode}")
        ranks.sort(key=lambda r: r["rank"])
    doc = dict(meta, world=world, ranks=ranks)
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
