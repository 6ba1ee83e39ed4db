#!/usr/bin/env python3
"""One rank of a two-process NCCL test through torch.distributed, for
scripts/device/must-agree-evidence.sh: a few all_reduce sizes and one send/recv, with a
watchdog that reports where the rank stopped when the communicator hangs.

The caller sets the variable under test in this process's environment (rank 1 only, to
measure a mismatch). Prints one JSON line: {"rank", "status": "ran" | "hung" | "error",
"stage", "busbw_gbs": {size: GB/s}, "error"}. Exit status 0 ran, 124 hung, 1 error.
"""

import argparse
import json
import os
import sys
import threading
import time

state = {"stage": "import"}


def report(rank, status, **extra):
    line = {"rank": rank, "status": status, "stage": state["stage"]}
    line.update(extra)
    print(json.dumps(line), flush=True)


def watchdog(rank, seconds):
    time.sleep(seconds)
    report(rank, "hung")
    os._exit(124)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=15.0)
    ap.add_argument("--sizes", default="1048576,67108864", help="all_reduce sizes in bytes")
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    threading.Thread(target=watchdog, args=(a.rank, a.timeout), daemon=True).start()
    try:
        import torch
        import torch.distributed as dist

        state["stage"] = "init"
        dev = torch.device("cuda", a.rank)
        torch.cuda.set_device(dev)
        dist.init_process_group(
            "nccl",
            init_method=f"tcp://127.0.0.1:{a.port}",
            rank=a.rank,
            world_size=2,
            device_id=dev,  # eager communicator creation: init hangs show as init
        )
        busbw = {}
        for size in [int(s) for s in a.sizes.split(",")]:
            state["stage"] = f"all_reduce {size} B"
            n = size // 4
            x = torch.ones(n, dtype=torch.float32, device=dev)
            dist.all_reduce(x)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(a.iters):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            t = (time.perf_counter() - start) / a.iters
            if x[0].item() != 2.0 ** (a.iters + 1):
                raise RuntimeError(f"wrong result at {size} B: {x[0].item()}")
            busbw[str(size)] = round(size / t / 1e9, 2)  # 2(n-1)/n = 1 for two ranks
        state["stage"] = "send/recv 16777216 B"
        y = torch.full((1 << 22,), float(a.rank), device=dev)
        if a.rank == 0:
            dist.send(y, dst=1)
        else:
            dist.recv(y, src=0)
        torch.cuda.synchronize()
        # Rank 0 must not leave before rank 1 has its data: a send completes locally
        # before the peer received it, and an exit then would read as a hang on rank 1.
        state["stage"] = "after send/recv"
        z = torch.ones(1, device=dev)
        dist.all_reduce(z)
        torch.cuda.synchronize()
        if a.rank == 1 and y[0].item() != 0.0:
            raise RuntimeError("send/recv delivered the wrong data")
        state["stage"] = "done"
        report(a.rank, "ran", busbw_gbs=busbw, nccl=".".join(map(str, torch.cuda.nccl.version())))
        dist.destroy_process_group()
        os._exit(0)
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        report(a.rank, "error", error=str(e).splitlines()[0][:300] if str(e) else repr(e))
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
