"""Where the GPT-2 124M training step's time goes, against the minimal step, on every GPU at once.

    torchrun --nproc-per-node=gpu benchmarks/gpt_diag.py --out gpt_diag.json [--batch-size 64]

Every variant trains the suite's own model (workloads.training._gpt_model) at the level's shape (seq 1024,
batch 64 on a GPU), bf16 autocast, fused AdamW, torch.compile of the whole model, random tokens, and is
timed as the suite times it (CUDA events around each step, the median after warm-up steps):
- ``suite``: workloads.training.gpt.run itself (DDP over the job, gradient clipping, clocks sampled);
- ``minimal``: the step alone, no DDP: forward, backward, clip to norm 1, AdamW;
- ``minimal_noclip``: without the gradient clip;
- ``minimal_ddp``: the minimal step inside DDP (gradient_as_bucket_view, as the suite);
- ``attention_<backend>``: the minimal step with scaled_dot_product_attention held to one backend
  (flash, cudnn, efficient), compiled again;
- ``cdt``: the minimal step compiled with inductor's coordinate-descent tuning of its generated kernels;
- ``autotune``: the minimal step compiled with mode max-autotune-no-cudagraphs (matmul templates tried too);
- ``stream_fp32``: the minimal step with an fp32 residual stream (``GPT.stream_dtype``; the suite's is bf16);
with ``minimal``, a profile of three steps: CUDA time per step by kernel, and by kind (attention, matmul,
fused pointwise, optimizer, NCCL). Each variant prints its line as it ends. tokens/s per GPU and MFU with the
flops of workloads.training._gpt_model (6N + 12 L d T per token) over --peak-tflops (default 989, the H100/H200
dense bf16 datasheet).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.common import distributed, gather_objects, time_runs  # noqa: E402
from workloads.training import gpt  # noqa: E402
from workloads.training._gpt_model import flops_per_token, matmul_params, mfu  # noqa: E402

BACKENDS = ("flash", "cudnn", "efficient")
KINDS = (("attention", ("flash", "fmha", "cudnn", "sdpa", "attention")), ("optimizer", ("adam", "multi_tensor")),
         ("nccl", ("nccl",)), ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "sm90")), ("fused", ("triton",)))


@contextmanager
def sdpa_backend(name: str | None) -> Iterator[None]:
    """scaled_dot_product_attention held to one backend (None: torch's own choice)."""
    if name is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
    with sdpa_kernel([chosen]):
        yield


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def minimal(cfg: gpt.Config, *, clip: bool = True, ddp: bool = False, backend: str | None = None,
            compile_kwargs: dict[str, Any] | None = None, steps: int = 20, warmup: int = 5,
            profile: bool = False, stream: torch.dtype | None = None) -> dict[str, Any]:
    """The minimal step's tokens/s (and, with ``profile``, its CUDA time by kernel); device memory given back."""
    torch._dynamo.reset()  # the backend, compile options and model's dtype act when the graph is traced
    with sdpa_backend(backend):
        out = _time_minimal(cfg, clip, ddp, compile_kwargs, steps, warmup, profile, stream)
    release()
    return out


def _time_minimal(cfg: gpt.Config, clip: bool, ddp: bool, compile_kwargs: dict[str, Any] | None, steps: int,
                  warmup: int, profile: bool, stream: torch.dtype | None) -> dict[str, Any]:
    device = torch.device(cfg.device)
    model = gpt.build(cfg)
    if stream is not None:  # None: the stream gpt.build makes (bf16 under bf16 autocast)
        model.stream_dtype = stream
    module: torch.nn.Module = model
    if compile_kwargs is not None and cfg.compile != "off":
        module = torch.compile(model, **compile_kwargs)  # type: ignore[assignment]
    else:
        module = gpt._compiled(model, cfg.compile)
    if ddp:
        module = DDP(module, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    opt = gpt.optimizer(model, cfg)
    batches = gpt.token_batches(cfg, 2)
    turn = [0]

    def step() -> None:
        x, y = batches[turn[0] % 2]
        turn[0] += 1
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            loss = module(x, y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    step()
    first_s = time.perf_counter() - t0
    times = time_runs(step, device, warmup, steps)
    out: dict[str, Any] = {"step_s": statistics.median(times), "first_step_s": first_s,
                           "max_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30
                           if device.type == "cuda" else None}
    if profile:
        out["profile"] = profiled(step, device, 3)
    return out


def profiled(step: Callable[[], None], device: torch.device, steps: int) -> dict[str, Any]:
    """CUDA time per step by kernel (top 25) and by kind, from torch.profiler over ``steps`` steps."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        us = getattr(e, "self_cuda_time_total", 0) if us is None else us
        if us > 0:
            rows.append({"name": e.key[:120], "ms_per_step": us / 1e3 / steps, "calls_per_step": e.count / steps})
    rows.sort(key=lambda r: -r["ms_per_step"])
    kinds: dict[str, float] = {}
    for r in rows:
        low = r["name"].lower()
        kind = next((k for k, words in KINDS if any(w in low for w in words)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + r["ms_per_step"]
    return {"kernels": rows[:25], "kinds_ms_per_step": kinds, "total_ms_per_step": sum(r["ms_per_step"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--batch-size", type=int, help="samples per step per GPU (default: the level's)")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--variants", default="suite,minimal,minimal_noclip,minimal_ddp,attention_cudnn",
                        help="comma-separated: suite, minimal, minimal_noclip, minimal_ddp, attention_<backend> "
                             f"({', '.join(BACKENDS)}), cdt, autotune, stream_fp32")
    parser.add_argument("--out", default="gpt_diag.json")
    args = parser.parse_args()
    with distributed() as here:
        device = here.device
        overrides = {"batch_size": args.batch_size} if args.batch_size else {}
        cfg = gpt.Config.for_level(args.level, device, peak_tflops=args.peak_tflops, **overrides)
        if cfg.compile == "regional":
            cfg = gpt.dataclasses.replace(cfg, compile="model")
        steps = 20 if device.type == "cuda" else 3
        tokens = cfg.batch_size * cfg.seq_len
        fpt = flops_per_token(matmul_params(gpt.build(cfg, "cpu")), cfg.n_layer, cfg.d_model, cfg.seq_len)
        rows: list[dict[str, Any]] = []

        def add(name: str, run: Callable[[], dict[str, Any]]) -> None:
            t0 = time.perf_counter()
            try:
                out = run()
            except Exception as exc:  # noqa: BLE001 - a backend this torch or GPU lacks is a finding, not a crash
                rows.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
                release()
                return
            tps = tokens / out["step_s"]
            rows.append({"variant": name, "tokens_per_s": tps, "mfu": mfu(tps, fpt, args.peak_tflops),
                         "wall_s": time.perf_counter() - t0, **out})
            if here.rank == 0:
                print(f"done {name}: {tps / 1e3:.1f}k tokens/s MFU {rows[-1]['mfu']:.4f}, first step "
                      f"{out['first_step_s']:.1f} s, wall {rows[-1]['wall_s']:.1f} s", flush=True)

        def suite() -> dict[str, Any]:
            r = gpt.run(cfg)
            release()
            return {"step_s": r.details["step_s"]["median_s"], "first_step_s": r.details["first_step_s"],
                    "max_memory_gib": r.details.get("max_memory_gib")}
        variants: dict[str, Callable[[], dict[str, Any]]] = {
            "suite": suite,
            "minimal": lambda: minimal(cfg, steps=steps, profile=True),
            "minimal_noclip": lambda: minimal(cfg, clip=False, steps=steps),
            "minimal_ddp": lambda: minimal(cfg, ddp=True, steps=steps),
            "cdt": lambda: minimal(cfg, steps=steps, compile_kwargs={"options": {"coordinate_descent_tuning": True}}),
            "autotune": lambda: minimal(cfg, steps=steps, compile_kwargs={"mode": "max-autotune-no-cudagraphs"}),
            "stream_fp32": lambda: minimal(cfg, steps=steps, stream=torch.float32),
            **{f"attention_{b}": (lambda b=b: minimal(cfg, backend=b, steps=steps))  # type: ignore[misc]
               for b in BACKENDS},
        }
        for name in [v for v in args.variants.split(",") if v]:
            if name not in variants:
                parser.error(f"unknown variant {name!r}; choose from {', '.join(variants)}")
            if device.type != "cuda" and name.startswith("attention_"):
                continue  # the fused attention backends are GPU kernels
            add(name, variants[name])
        everyone = gather_objects({"rank": here.rank, "rows": rows})
        if here.rank == 0:
            Path(args.out).write_text(json.dumps({"config": gpt.dataclasses.asdict(cfg), "flops_per_token": fpt,
                                                  "ranks": everyone}, indent=1))
            print(f"GPT-2 {cfg.preset} seq {cfg.seq_len} batch {cfg.batch_size}/GPU, peak {args.peak_tflops} TFLOPS")
            for r in everyone:
                for row in r["rows"]:
                    if "error" in row:
                        print(f"rank {r['rank']} {row['variant']:>20}: {row['error']}")
                        continue
                    print(f"rank {r['rank']} {row['variant']:>20}: {row['tokens_per_s'] / 1e3:7.1f}k tokens/s "
                          f"MFU {row['mfu']:.4f} step {row['step_s'] * 1e3:7.2f} ms first {row['first_step_s']:5.1f} s "
                          f"wall {row['wall_s']:5.1f} s mem {row.get('max_memory_gib') or 0:5.1f} GiB")
                    for kind_row in [row["profile"]] if "profile" in row else []:
                        kinds = ", ".join(f"{k} {v:.2f}" for k, v in sorted(kind_row["kinds_ms_per_step"].items(),
                                                                              key=lambda kv: -kv[1]))
                        print(f"    CUDA ms/step {kind_row['total_ms_per_step']:.2f}: {kinds}")
                        for k in kind_row["kernels"][:12]:
                            print(f"      {k['ms_per_step']:7.2f} ms x{k['calls_per_step']:5.0f}  {k['name'][:100]}")
            print(f"written: {args.out}")


if __name__ == "__main__":
    main()
