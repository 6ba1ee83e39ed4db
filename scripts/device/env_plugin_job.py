#!/usr/bin/env python3
"""A two-process PyTorch all_reduce job that sets no NCCL variable of its own (unless the
caller's environment does): what Heddle's NCCL environment plugin changes, and what it costs.

Prints one JSON line from rank 0: the time from init_process_group to the end of the first
collective (NCCL init), the 8 B all_reduce latency (median of batches) and the 256 MiB
all_reduce bus bandwidth. Run it with and without NCCL_ENV_PLUGIN (or libnccl-env.so on
LD_LIBRARY_PATH) and NCCL_DEBUG=INFO; scripts/device/env-plugin-proof.sh does.
"""

import json
import os
import statistics
import sys
import time


def rank_main(rank, port, q):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    small = torch.ones(2, device="cuda")  # 8 B of fp32
    t0 = time.perf_counter()
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    dist.all_reduce(small)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    lat = []
    for _ in range(5):
        n = 300
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(small)
        torch.cuda.synchronize()
        lat.append((time.perf_counter() - t) / n * 1e6)
    big = torch.ones(64 << 20, device="cuda")  # 256 MiB
    for _ in range(3):
        dist.all_reduce(big)
    torch.cuda.synchronize()
    bws = []
    for _ in range(3):
        n = 10
        t = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(big)
        torch.cuda.synchronize()
        bws.append(big.numel() * 4 / ((time.perf_counter() - t) / n) / 1e9)  # busbw factor 1 at 2 ranks
    if rank == 0:
        q.put({"init_s": round(init_s, 3), "lat8_us": round(statistics.median(lat), 2),
               "lat8_us_batches": [round(x, 2) for x in lat],
               "busbw_256m_gbs": round(statistics.median(bws), 1)})
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29611
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=rank_main, args=(r, port, q)) for r in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    out = q.get() if not q.empty() else {}
    out["exit"] = [p.exitcode for p in ps]
    print(json.dumps(out), flush=True)
    sys.exit(0 if all(p.exitcode == 0 for p in ps) else 1)
