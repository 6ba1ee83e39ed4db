"""A small PyTorch DDP training job for scripts/device/hang.sh (run under torchrun, two
ranks on one GPU, each its own NCCL "host"), with one fault the job itself brings:

  FAULT=sleep      rank 1 sleeps 60 s in Python at step 10 (rank 0 waits inside NCCL)
  FAULT=slow       rank 1 sleeps 150 ms before every step (a straggler)
  FAULT=pause      every rank sleeps 90 s at step 10 (evaluation, a checkpoint)
  FAULT=algo       the ranks set NCCL_ALGO differently (Ring on rank 0, Tree on rank 1);
                   NCCL 2.28.9 fails PyTorch's first AllGather at once on the Tree rank
                   (AllGather has no Tree algorithm): an error, not a hang
  FAULT=proto      the ranks set NCCL_PROTO differently (Simple on rank 0, LL on rank 1)
  FAULT=none       (or unset; also for FAULT=sigstop, where hang.sh stops rank 1 itself)

No Heddle variable is read or set: the plugins come from the node (docs/jobs.md). Each
rank prints `step N` lines and its pid first, so hang.sh can find and stop rank 1.
FAULT, STEPS and NCCL_HOSTID are this job's own settings, not Heddle's."""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    rank = int(os.environ["RANK"])
    fault = os.environ.get("FAULT", "none")
    steps = int(os.environ.get("STEPS", "400"))
    # One GPU holds a "two-host" job: each rank is its own NCCL host, so the ranks talk
    # over NCCL's network transport (sockets here) as two nodes would.
    os.environ["NCCL_HOSTID"] = f"hang-host-{rank}"
    if fault == "algo":
        os.environ["NCCL_ALGO"] = "Ring" if rank == 0 else "Tree"
    if fault == "proto":
        os.environ["NCCL_PROTO"] = "Simple" if rank == 0 else "LL"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    print(f"rank {rank} pid {os.getpid()}", flush=True)
    # About 50 M parameters.
    model = nn.Sequential(
        nn.Embedding(8192, 1024),
        *[nn.TransformerEncoderLayer(1024, 16, 2048, batch_first=True) for _ in range(5)],
        nn.Linear(1024, 8192),
    ).cuda()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        if step == 10:
            print(f"rank {rank} fault point at {time.time():.3f}", flush=True)
        if fault == "slow" and rank == 1:
            time.sleep(0.15)
        if step == 10 and fault == "sleep" and rank == 1:
            time.sleep(60)
        if step == 10 and fault == "pause":
            time.sleep(90)
        x = torch.randint(0, 8192, (8, 128), device="cuda")
        loss = loss_fn(ddp(x).reshape(-1, 8192), x.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            torch.cuda.synchronize()
            print(f"rank {rank} step {step} at {time.time():.3f}", flush=True)
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
