"""Matmul, copy, host-link and burn-in logic on the CPU: arithmetic, correctness checks, tiny real runs."""

from __future__ import annotations

import json

import pytest
import torch

from workloads.gpu import burn_in, hbm, hostlink, matmul
from workloads.result import WorkloadError

CPU = torch.device("cpu")


def test_flop_and_byte_arithmetic() -> None:
    assert matmul.flops((8192, 8192, 8192)) == 2 * 8192**3
    assert matmul.tflops((8192, 8192, 8192), 1.375e-3) == pytest.approx(799.6, rel=1e-3)
    assert matmul.tflops((1024, 1024, 1024), 1.0, products=10) == pytest.approx(10 * 2 * 1024**3 / 1e12)
    assert hbm.copy_tbps(4 << 30, 2.9e-3) == pytest.approx(2 * 4 * 2**30 / 2.9e-3 / 1e12)
    assert hostlink.gbps(1 << 30, 0.02) == pytest.approx(53.69, rel=1e-3)


def test_rotation_passes_the_cache() -> None:
    l2 = 50 << 20
    # 4096^3 bf16: A, B, C are 32 MiB each: two sets pass 3x L2 (150 MiB)
    assert matmul.sets_needed((4096, 4096, 4096), "bf16", 3 * l2) == 2
    assert matmul.sets_needed((16384, 16384, 16384), "bf16", 3 * l2) == 1
    assert matmul.sets_needed((2048, 2048, 13312), "fp8", 3 * l2) == 3


def test_config_for_levels() -> None:
    gpu_like = matmul.Config(dtype="bf16", shapes=matmul.GPU_SHAPES["standard"])
    assert (8192, 8192, 8192) in gpu_like.shapes and any(len(set(s)) > 1 for s in gpu_like.shapes)
    assert len(matmul.wide_sweep()) == 144 and set(matmul.GPU_SHAPES["standard"]) <= set(matmul.wide_sweep()) | set(
        matmul.LONG_K)
    cpu = matmul.Config.for_level("standard", CPU, "tf32", peak_tflops=1.0)
    assert max(max(s) for s in cpu.shapes) <= 512 and cpu.tolerance == 2e-3
    with pytest.raises(ValueError, match="multiple of 16"):
        matmul.Config(dtype="fp8", shapes=((100, 128, 128),))
    with pytest.raises(ValueError, match="dtype"):
        matmul.Config(dtype="int8")
    assert "not a CPU" in (matmul.fp8_unsupported(CPU) or "")


def _set(dtype: str, shape: tuple[int, int, int] = (96, 80, 64)) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    s = matmul.operands(shape, dtype, CPU, gen)
    matmul.product_fn(dtype, CPU)(s)
    return s


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "tf32", "fp8"])
def test_correct_product_passes_its_tolerance(dtype: str) -> None:
    if dtype == "fp8" and not hasattr(torch, "_scaled_mm"):
        pytest.skip("torch without _scaled_mm")
    try:
        s = _set(dtype)
    except RuntimeError as exc:  # a CPU build without fp8 kernels
        pytest.skip(f"{dtype} product not available on this CPU build: {exc}")
    rows, cols = torch.arange(32), torch.arange(32)
    err = matmul.sample_error(*s, rows, cols)
    matmul.check_error(err, matmul.RTOL[dtype], dtype)
    assert err["max_rel_err"] < matmul.RTOL[dtype] / 2  # margin, so real rounding never trips it


@pytest.mark.parametrize("corrupt", ["one_element", "nan", "scaled"])
def test_planted_matmul_errors_are_caught(corrupt: str) -> None:
    a, b_t, c = _set("bf16")
    if corrupt == "one_element":
        c[3, 5] += 0.1 * c.float().pow(2).mean().sqrt().to(c.dtype)  # one wrong element, 10% of rms
    elif corrupt == "nan":
        c[7, 7] = float("nan")
    else:
        c.mul_(1.05)
    rows, cols = torch.arange(96), torch.arange(80)
    with pytest.raises(WorkloadError, match="wrong result"):
        matmul.check_error(matmul.sample_error(a, b_t, c, rows, cols), 1e-2, "planted")


def test_matmul_run_on_cpu_records_best_and_median() -> None:
    cfg = matmul.Config(dtype="bf16", shapes=((64, 64, 64), (96, 64, 128)), seconds_per_shape=0.02,
                        warmup_s=0.0, rotate_bytes=1 << 20, peak_tflops=1.0)
    result = matmul.run(cfg)
    metric = result.metric("matmul_bf16_tflops")
    d = result.details
    assert metric.unit == "TFLOPS" and metric.scope == "gpu" and metric.value == d["best_tflops"] > 0
    assert d["median_over_shapes_tflops"] <= d["best_tflops"] and d["efficiency"] == pytest.approx(metric.value)
    assert all(s["tflops_min"] <= s["tflops"] <= s["tflops_max"] for s in d["shapes"])
    json.dumps(d)


def test_fp8_run_refuses_cpu() -> None:
    with pytest.raises(WorkloadError, match="fp8"):
        matmul.run(matmul.Config(dtype="fp8", shapes=((64, 64, 64),)))


def test_copy_check_names_the_first_wrong_element() -> None:
    src = torch.randn(1000)
    dst = src.clone()
    hbm.check_copy(dst, src, "ok")
    dst[417] += 1
    with pytest.raises(WorkloadError, match="1 of 1000 .* first at 417"):
        hbm.check_copy(dst, src, "planted")


def test_hbm_run_on_cpu() -> None:
    result = hbm.run(hbm.Config(sizes=(1 << 20, 4 << 20), seconds_per_size=0.01, warmup=1))
    m = result.metric("hbm_bandwidth_tbps")
    assert m.unit == "TB/s" and "read + bytes written" in m.description and m.value > 0
    assert {s["bytes"] for s in result.details["sizes"]} == {1 << 20, 4 << 20}
    with pytest.raises(ValueError):
        hbm.Config(sizes=(7,))


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_hostlink_run_on_cpu_is_a_labelled_stand_in(direction: str) -> None:
    cfg = hostlink.Config(direction=direction, sizes=(1 << 20,), seconds_per_size=0.01, warmup=1)
    m = hostlink.run(cfg).metric(f"{direction}_bandwidth_gbps")
    assert m.unit == "GB/s" and "stand-in" in m.description and m.value > 0
    with pytest.raises(ValueError, match="direction"):
        hostlink.Config(direction="p2p")


def test_burn_in_short_run_on_cpu() -> None:
    cfg = burn_in.Config(duration_s=0.5, shape=(64, 64, 64), interval_s=0.1, outputs=2)
    result = burn_in.run(cfg)
    d = result.details
    assert d["wrong_elements"] == 0 and d["products"] > 0 and result.metric("burn_in_tflops").value > 0
    assert d["comparison"] == "bitwise" and len(d["intervals"]) >= 2


def _details(**over: object) -> dict:
    base = {"wrong_elements": 0, "wrong_intervals": [], "comparison": "bitwise",
            "clocks": {"status": "sampled", "samples": 10, "clock_event_reasons": {"sw_power_cap": 1.0},
                       "bad_clock_events": [], "temperature_c": {"max": 70}}}
    base.update(over)
    return base


def test_burn_in_problems() -> None:
    assert burn_in.burn_in_problems(_details(), on_gpu=True) == []
    wrong = burn_in.burn_in_problems(_details(wrong_elements=12, wrong_intervals=[3]), on_gpu=True)
    assert "12 wrong elements" in wrong[0] and "[3]" in wrong[0]
    hot = _details(clocks={"status": "sampled", "clock_event_reasons": {"hw_thermal_slowdown": 0.4},
                           "bad_clock_events": ["hw_thermal_slowdown"], "temperature_c": {"max": 92}})
    assert "hw_thermal_slowdown" in burn_in.burn_in_problems(hot, on_gpu=True)[0]
    blind = _details(clocks={"status": "NVML unavailable: x"})
    assert "could not be watched" in burn_in.burn_in_problems(blind, on_gpu=True)[0]
    assert burn_in.burn_in_problems(_details(clocks={"status": "not applicable: CPU device"}), on_gpu=False) == []
