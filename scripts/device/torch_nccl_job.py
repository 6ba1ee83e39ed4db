"""A two-process PyTorch job for scripts/device-e2e.sh (run under torch.distributed.run):
256 MiB all_reduce over NCCL, 5 warm-up and 20 timed, with whatever NCCL plugins the
environment names. Rank 0 prints one line with the busbw."""

import os
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    x = torch.ones(64 << 20, dtype=torch.float32, device="cuda")  # 256 MiB
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    secs = (time.perf_counter() - start) / 20
    algbw = x.numel() * 4 / secs / 1e9
    if rank == 0:
        print(f"torch all_reduce 256 MiB on {world} ranks: busbw {algbw * 2 * (world - 1) / world:.1f} GB/s, nccl {torch.cuda.nccl.version()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
