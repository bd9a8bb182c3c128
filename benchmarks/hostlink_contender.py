"""Another job on one GPU's host link: pinned copies back to back, to show the suite catches a restricted link.

It copies between a pinned host buffer and the GPU without pause, host to GPU and GPU to host on streams of
their own, so the GPU's PCIe link is busy in both directions while the suite measures it. With this running on
GPU N, the suite's host-link tests must fail naming that GPU (each GPU alone reads about 55 GB/s; sharing the
link leaves it about half, below the profile's min of 45), and ``test_no_foreign_gpu_processes`` names this
process (a copy needs a CUDA context on the GPU):

    python benchmarks/hostlink_contender.py --seconds 300 --device 1 &
    torchrun --standalone --nproc-per-node=2 -m pytest acceptance --level quick -k "host_link or foreign"
    kill %1

It prints its pid, and when it stops (by itself after ``--seconds``) what it copied: its own GB/s each way,
the share of the link it held. ``--device cpu`` copies between two host buffers with a small size (the suite's
dry run).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

GiB = 1 << 30
BATCH = 8
"""Copies queued on each stream between two synchronisations: enough to keep the link busy, few enough that the
process stops soon after it is told to."""


def buffers(device: torch.device, nbytes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(host source, device target, device source, host target); the host buffers pinned on a GPU, random bytes
    (zeros may compress on some links)."""
    pin = device.type == "cuda"
    host_in = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).pin_memory() if pin else \
        torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    host_out = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    dev_in = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev_out = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    return host_in, dev_in, dev_out, host_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--device", default="0", help="one CUDA device index, or 'cpu'")
    parser.add_argument("--direction", choices=("h2d", "d2h", "both"), default="both")
    parser.add_argument("--mib", type=int, default=256, help="bytes of each copy, in MiB (pinned host memory x2)")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    device = torch.device("cpu") if cpu else torch.device(f"cuda:{int(args.device)}")
    nbytes = (1 if cpu else args.mib) << 20
    host_in, dev_in, dev_out, host_out = buffers(device, nbytes)
    ways = ("h2d", "d2h") if args.direction == "both" else (args.direction,)
    streams = {w: torch.cuda.Stream(device) for w in ways} if not cpu else {}
    print(f"hostlink_contender pid {os.getpid()}: {nbytes >> 20} MiB pinned copies {'+'.join(ways)} on {device} for "
          f"{args.seconds:g} s", flush=True)
    copied = dict.fromkeys(ways, 0)
    start = time.monotonic()
    end = start + args.seconds
    while time.monotonic() < end:
        for way in ways:
            target, source = (dev_in, host_in) if way == "h2d" else (host_out, dev_out)
            if cpu:
                for _ in range(BATCH):
                    target.copy_(source)
                continue
            with torch.cuda.stream(streams[way]):
                for _ in range(BATCH):
                    target.copy_(source, non_blocking=True)
        for stream in streams.values():
            stream.synchronize()  # a bounded queue: the process stops when told to
        for way in ways:
            copied[way] += BATCH * nbytes
    seconds = time.monotonic() - start
    said = ", ".join(f"{way} {copied[way] / GiB:.1f} GiB ({copied[way] / seconds / 1e9:.1f} GB/s)" for way in ways)
    print(f"hostlink_contender pid {os.getpid()}: {said} in {seconds:.1f} s, done", flush=True)


if __name__ == "__main__":
    main()
