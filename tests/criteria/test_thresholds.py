"""thresholds.yaml loading: the shipped file is valid, and every broken input names file, key, fix."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cluster_runs import node_results, write_node

from clustergate.criteria.criterion import Figure
from clustergate.criteria.sources import CITED
from clustergate.criteria.thresholds import ThresholdsError, load

from torchrun_job import PLANTED_SUITE, ROOT, job_env, run_job

REFERENCE = ROOT / "docs" / "reference-figures.md"
MEASURED_ON_H100 = {"matmul_fp16_tflops", "matmul_tf32_tflops", "matmul_fp8_tflops", "matmul_bf16_sustained_tflops",
                    "hbm_bandwidth_tbps", "h2d_bandwidth_gbps", "d2h_bandwidth_gbps", "train_tokens_per_s_per_gpu",
                    "train_mfu"}
MEASURED_ON_H200 = MEASURED_ON_H100 | {"gpu_memory_gib"}
MEASURED_ON_TWO_GPUS = {"intranode_allreduce_busbw_gbps", "intranode_allgather_busbw_gbps",
                        "intranode_alltoall_busbw_gbps", "intranode_broadcast_busbw_gbps", "intranode_sendrecv_bw_gbps",
                        "intranode_allreduce_latency_us", "h2d_bandwidth_all_gpus_gbps", "d2h_bandwidth_all_gpus_gbps"}
SIGN_OFF = ("h100-sxm-80gb", "h200", "h100-sxm-80gb-1gpu", "h100-sxm-80gb-2gpu", "h100-sxm-80gb-4gpu", "h200-1gpu",
            "h200-2gpu", "h200-4gpu")
PERFORMANCE_UNITS = {"GB/s", "Gb/s", "TB/s", "TFLOPS", "tokens/s", "us", "GiB/s", "IOPS"}
PERFORMANCE_FRACTIONS = {"train_mfu", "train_original_mfu", "scaling_efficiency"}
RECORDED_ONLY = {
    "shared_fs_write_gbps": "shared storage is the site's: it adds its own min",
    "shared_fs_read_gbps": "shared storage is the site's",
    "lora_tokens_per_s_per_gpu": "a figure of the fine-tuning stack (transformers, peft), not of the node",
    "fsdp_tokens_per_s_per_gpu": "a figure of the fine-tuning stack (FSDP)",
    "zero3_tokens_per_s_per_gpu": "a figure of the fine-tuning stack (DeepSpeed)",
    "train_original_tokens_per_s_per_gpu": "the original benchmark's eager settings at --level extended, to compare",
    "train_original_mfu": "as its tokens/s; its ceiling only catches a measurement error",
    "rdma_write_lat_us": "no published per-HCA write latency criterion found (perftest ib_write_lat): recorded",
}
NO_PEERS = {"scaling_efficiency": "one figure of the whole fabric job: nothing to compare it with"}

GOOD = """
schema: 1
fallback_profile: generic
cpu_profile: cpu
profiles:
  base:
    match: ["H100"]
    settings: {gpus_per_node: 8, peak_bf16_tflops: 989}
    metrics:
      matmul_bf16_tflops: {min: 700, unit: TFLOPS}
      gpu_memory_gib: {min: 79}
  child:
    extends: base
    match: ["H200"]
    settings: {peak_bf16_tflops: 990}
    metrics:
      gpu_memory_gib: {min: 139}
  generic: {sign_off: false, metrics: {matmul_bf16_tflops: {}}}
  cpu: {settings: {gpus_per_node: 0}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "thresholds.yaml"
    path.write_text(text)
    return path


def test_shipped_file_loads_and_selects_by_gpu_name() -> None:
    t = load(ROOT / "thresholds.yaml")
    assert t.select("NVIDIA H100 80GB HBM3").name == "h100-sxm-80gb"
    assert t.select("NVIDIA H200").name == "h200"
    assert t.select("NVIDIA H200", gpus=8).name == "h200"
    assert t.select("NVIDIA A100-SXM4-80GB").name == "nvidia-generic"
    assert t.select(None).name == "cpu"
    assert t.profile("h200").metrics["matmul_bf16_tflops"].get("min") == 700  # inherited
    assert not t.profile("nvidia-generic").sign_off


def test_every_shipped_criterion_says_its_source_and_every_estimate_only_warns() -> None:
    """A reader weighs a miss by where the figure comes from; an estimate cannot reject."""
    t = load(ROOT / "thresholds.yaml")
    for profile in t.profiles.values():
        for name, c in profile.metrics.items():
            where = f"{profile.name}.{name}"
            assert c.source is not None or not c.judged, f"{where} judges without a source"
            assert c.source is None or c.source.kind != "estimate" or c.severity == "warn", f"{where}: estimate fails"
    h100 = t.profile("h100-sxm-80gb").metrics
    assert {n for n, c in h100.items() if c.source and c.source.kind == "spec" and c.severity == "fail"} >= {
        "gpu_count", "gpu_memory_gib", "matmul_bf16_tflops", "allreduce_busbw_gbps"}
    assert t.profile("cpu").metrics["matmul_bf16_tflops"].source_text().startswith("measured (clustergate")


def extends_chain(name: str) -> list[str]:
    """The profile and every profile it extends, nearest first (as thresholds.yaml writes them)."""
    raw = yaml.safe_load((ROOT / "thresholds.yaml").read_text())["profiles"]
    chain = [name]
    while (parent := raw[chain[-1]].get("extends")) is not None:
        chain.append(parent)
    return chain


def criteria_rows() -> dict[str, dict[str, tuple[str, float, str]]]:
    """profile -> metric -> (bound, value, source kind), from the reference document's tables of sign-off
    criteria, each under the line that names its profiles (Criteria of `a` and `b`)."""
    rows: dict[str, dict[str, tuple[str, float, str]]] = {}
    profiles: list[str] = []
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("Criteria of "):  # the profiles named before the parenthesis
            profiles = re.findall(r"`([\w-]+)`", line.split("(")[0])
        elif m := re.match(r"\| `(\w+)` \| (min|max|outlier_fraction|outlier_multiple) ([\d.]+) \| ([a-z]+) \|", line):
            for profile in profiles:
                rows.setdefault(profile, {})[m[1]] = (m[2], float(m[3]), m[4])
    return rows


def is_performance(name: str, unit: str | None) -> bool:
    return unit in PERFORMANCE_UNITS or name in PERFORMANCE_FRACTIONS


@pytest.mark.parametrize("name", SIGN_OFF)
def test_every_performance_criterion_of_a_sign_off_profile_fails_and_cites_its_source(name: str) -> None:
    """No warn or estimate performance criterion in a sign-off profile: each fails, rests on a cited source
    (spec, measured, published) or on its peers alone, carries a peer bound for the fleet, and has its row in
    docs/reference-figures.md with the same bound and source, where the profile (or one it extends) defines it."""
    profile = load(ROOT / "thresholds.yaml").profile(name)
    assert profile.sign_off
    rows = criteria_rows()
    chain = extends_chain(name)
    performance = {m: c for m, c in profile.metrics.items() if is_performance(m, c.unit)}
    assert len(performance) >= 40, sorted(performance)
    for metric, c in performance.items():
        where = f"{name}.{metric}"
        if metric in RECORDED_ONLY:
            assert not (c.get("min") or c.get("max") or c.judges_peers), f"{where} is judged: take it off RECORDED_ONLY"
            continue
        assert c.severity == "fail", f"{where} only warns"
        assert c.source is not None and c.source.kind in (*CITED, "peers"), f"{where}: source {c.source}"
        assert c.judges_peers or metric in NO_PEERS, f"{where} has no outlier bound: the fleet cannot judge it"
        absolute = next(((key, c.get(key)) for key in ("min", "max") if c.get(key) is not None), None)
        assert (absolute is None) == (c.source.kind == "peers"), where
        bound = absolute or next((key, c.get(key)) for key in ("outlier_fraction", "outlier_multiple")
                                 if c.get(key) is not None)
        row = next((rows[p][metric] for p in chain if metric in rows.get(p, {})), None)
        assert row is not None, f"{where}: no row in {REFERENCE.name} (Criteria of `{name}`)"
        assert row == (*bound, c.source.kind), f"{where}: {REFERENCE.name} says {row}, thresholds.yaml {bound}, " \
                                               f"{c.source.kind}"


@pytest.mark.parametrize(("model", "gpus", "name"), [
    ("NVIDIA H100 80GB HBM3", 1, "h100-sxm-80gb-1gpu"), ("NVIDIA H100 80GB HBM3", 2, "h100-sxm-80gb-2gpu"),
    ("NVIDIA H100 80GB HBM3", 4, "h100-sxm-80gb-4gpu"), ("NVIDIA H100 80GB HBM3", 8, "h100-sxm-80gb"),
    ("NVIDIA H200", 1, "h200-1gpu"), ("NVIDIA H200", 2, "h200-2gpu"), ("NVIDIA H200", 4, "h200-4gpu"),
    ("NVIDIA H200", 8, "h200"), ("NVIDIA H200", 3, "h200"), ("NVIDIA H200", None, "h200")])
def test_the_node_shape_chooses_the_profile(model: str, gpus: int | None, name: str) -> None:
    """The model's profile whose gpus_per_node is the node's GPU count; a count no profile has (3: a node of 4 that
    lost one) gets the model's first, whose gpu_count then fails naming the count it expects."""
    p = load(ROOT / "thresholds.yaml").select(model, gpu_node=True, gpus=gpus)
    assert p.name == name
    expected = gpus if gpus in (1, 2, 4) else 8
    assert p.settings["gpus_per_node"] == expected
    assert p.criterion("gpu_count").get("min") == p.criterion("gpu_count").get("max") == expected
    assert p.criterion("gpu_count").judge([Figure(3, "GPUs", 0)], "node") != [[]]


def test_a_healthy_node_of_two_h200s_passes_its_shape_and_not_the_8_gpu_profile() -> None:
    """The node of 2 H200s whose all_reduce read 323.7 GB/s (nccl-tests 323.8): rejected by the 8-GPU bound of
    350, accepted by its own shape's; its fellow figures too."""
    t = load(ROOT / "thresholds.yaml")
    two, eight = t.select("NVIDIA H200", gpus=2), t.profile("h200")
    read = {"intranode_allreduce_busbw_gbps": 323.7, "allreduce_busbw_gbps": 325.7,
            "intranode_allgather_busbw_gbps": 265.7, "intranode_alltoall_busbw_gbps": 330.5,
            "intranode_broadcast_busbw_gbps": 369.2, "intranode_sendrecv_bw_gbps": 359.9,
            "intranode_allreduce_latency_us": 8.5, "h2d_bandwidth_all_gpus_gbps": 52.0}
    for metric, value in read.items():
        c = two.criterion(metric)
        assert c.weigh([Figure(value, c.unit or "", 0)], "node") == [([], [])], metric
    assert eight.criterion("intranode_allreduce_busbw_gbps").weigh([Figure(323.7, "GB/s", 0)], "node")[0][0]
    # Collectives forced off NVLink (through host memory: tens of GB/s) fail every shape's intra-node criteria.
    for shape in (two, t.select("NVIDIA H200", gpus=4), eight):
        for metric in ("intranode_allreduce_busbw_gbps", "intranode_sendrecv_bw_gbps", "intranode_pair_bw_gbps"):
            c = shape.criterion(metric)
            assert c.weigh([Figure(20.0, "GB/s", 0)], "node")[0][0], (shape.name, metric)


def test_the_references_the_criteria_cite_ship_in_the_repository() -> None:
    text = (ROOT / "thresholds.yaml").read_text()
    cited = set(re.findall(r"[\w./-]+\.md\b", text))
    assert cited and all((ROOT / c).is_file() for c in cited), cited
    assert "/work/" not in text


def measured_rows() -> dict[str, dict[str, tuple[str, float, float]]]:
    """profile -> metric -> (min or max, its value, the worst reading), from the reference document's tables of
    measured criteria, each under the line that names its profiles (Profile `name`, Profiles `a` and `b`)."""
    rows: dict[str, dict[str, tuple[str, float, float]]] = {}
    profiles: list[str] = []
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("Profile"):
            profiles = re.findall(r"`([\w-]+)`", line.split(";")[0])
        elif m := re.match(r"\| `(\w+)` \| (min|max) ([\d.]+) \| ([\d.]+) \|", line):
            for profile in profiles:
                rows.setdefault(profile, {})[m[1]] = (m[2], float(m[3]), float(m[4]))
    return rows


@pytest.mark.parametrize(("profile", "measured"), [
    ("h100-sxm-80gb", MEASURED_ON_H100), ("h200", MEASURED_ON_H200), ("h100-sxm-80gb-2gpu", MEASURED_ON_TWO_GPUS),
    ("h200-2gpu", MEASURED_ON_TWO_GPUS), ("h200-4gpu", {"intranode_pair_bw_gbps"})])
def test_measured_criteria_pass_the_worst_reading_and_fail_a_part_at_half_of_it(profile: str,
                                                                                 measured: set[str]) -> None:
    criteria = load(ROOT / "thresholds.yaml").profile(profile).metrics
    rows = measured_rows().get(profile, {})
    assert set(rows) >= measured, sorted(measured - set(rows))
    for name, (key, bound, worst) in rows.items():
        c = criteria[name]
        assert c.source is not None and c.source.kind == "measured" and c.severity == "fail", name
        assert c.get(key) == bound, f"{profile} {name}: thresholds.yaml says {key} {c.get(key)}, " \
                                    f"{REFERENCE.name} {bound}"
        assert c.weigh([Figure(worst, c.unit or "", 0)], "gpu") == [([], [])], name
        off = worst / 2 if key == "min" else worst * 2
        assert c.weigh([Figure(off, c.unit or "", 0)], "gpu")[0][0], f"{name}: a part at half its figure passes"


def test_extends_merges_settings_and_metrics(tmp_path: Path) -> None:
    t = load(write(tmp_path, GOOD))
    child = t.profile("child")
    assert child.settings == {"gpus_per_node": 8, "peak_bf16_tflops": 990}
    assert child.metrics["gpu_memory_gib"].get("min") == 139
    assert child.metrics["matmul_bf16_tflops"].unit == "TFLOPS"
    assert child.digest != t.profile("base").digest


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("schema: 1\nprofiles: [", "not valid YAML at line"),
        ("- a list", "top level"),
        (GOOD.replace("schema: 1", "schema: 2"), "schema: must be 1"),
        (GOOD.replace("cpu_profile: cpu", "cpu_profile: cpu\nextra: 1"), "extra: unknown top-level key"),
        (GOOD.replace("match: [\"H100\"]", "match: [\"H100\"]\n    colour: red"), "profiles.base.colour: unknown key"),
        (GOOD.replace("{min: 700, unit: TFLOPS}", "{minimum: 700}"),
         "profiles.base.metrics.matmul_bf16_tflops.minimum: unknown key"),
        (GOOD.replace("{min: 700, unit: TFLOPS}", "{min: fast}"),
         "profiles.base.metrics.matmul_bf16_tflops.min: must be a finite number, got 'fast'"),
        # YAML 1.1 (PyYAML) reads an exponent without a dot and a sign as text: the error says how to write it
        (GOOD.replace("{min: 700, unit: TFLOPS}", "{max: 1e308}"),
         "matmul_bf16_tflops.max: must be a finite number, got '1e308'; YAML 1.1 reads `1e308` as text: write "
         "`1.0e+308`"),
        (GOOD.replace("peak_bf16_tflops: 989}", "peak_bf16_tflops: 5e-3}"),
         "profiles.base.settings.peak_bf16_tflops: must be int or float, got '5e-3'; YAML 1.1 reads `5e-3` as text: "
         "write `0.005`"),
        (GOOD.replace("{min: 700, unit: TFLOPS}", "{min: 9, max: 1}"),
         "profiles.base.metrics.matmul_bf16_tflops: min 9 is above max 1: no figure can pass"),
        (GOOD.replace("{min: 700, unit: TFLOPS}", "{min: 700, ceiling: 600}"),
         "matmul_bf16_tflops: min 700 is above ceiling 600"),
        (GOOD.replace("{min: 700, unit: TFLOPS}", "{min: .nan}"), "matmul_bf16_tflops.min: must be a finite number"),
        (GOOD.replace("{min: 700, unit: TFLOPS}", "{max: .inf}"), "matmul_bf16_tflops.max: must be a finite number"),
        (GOOD.replace("{min: 700, unit: TFLOPS}", "{outlier_fraction: 0}"), "outlier_fraction: must lie in (0, 1]"),
        (GOOD.replace("gpus_per_node: 8,", "gpus_per_node: -3,"),
         "profiles.base.settings.gpus_per_node: must be >= 0, got -3"),
        (GOOD.replace("peak_bf16_tflops: 989}", "peak_bf16_tflops: 989, test_timeout_s: 0}"),
         "profiles.base.settings.test_timeout_s: must be a finite number > 0, got 0"),
        (GOOD.replace("peak_bf16_tflops: 989}", "peak_bf16_tflops: 989, collective_timeout_s: .nan}"),
         "profiles.base.settings.collective_timeout_s: must be a finite number > 0"),
        (GOOD.replace("peak_bf16_tflops: 989}", "peak_bf16_tflops: 989, test_timeout_s: -5}"),
         "profiles.base.settings.test_timeout_s: must be a finite number > 0, got -5"),
        (GOOD.replace("peak_bf16_tflops: 989}", "peak_bf16_tflops: 989, pcie_width: 0}"),
         "profiles.base.settings.pcie_width: must be >= 1, got 0"),
        (GOOD.replace("peak_bf16_tflops: 989}", "peak_bf16_tflops: 989, baseline_tolerance: 1.5}"),
         "profiles.base.settings.baseline_tolerance: must lie in (0, 1], got 1.5"),
        (GOOD.replace("peak_bf16_tflops: 989}", "peak_bf16_tflops: 989, drift_fraction: 1}"),
         "profiles.base.settings.drift_fraction: must lie in (0, 1), got 1"),
        (GOOD.replace("peak_bf16_tflops: 989}", "peak_bf16_tflops: 989, drift_severity: error}"),
         "profiles.base.settings.drift_severity: must be 'warn' or 'fail', got 'error'"),
        (GOOD.replace("gpu_memory_gib: {min: 79}", "gpu_memory_gib: {min: 79}\n      gpu_memory_gib: {min: 80}"),
         "not valid YAML at line 12, column 7: duplicate key 'gpu_memory_gib' (first at line 11); give each key once"),
        (GOOD.replace("gpus_per_node: 8,", "gpus_per_node: eight,"),
         "profiles.base.settings.gpus_per_node: must be int, got 'eight'"),
        (GOOD.replace("gpus_per_node: 8,", "gpu_per_node: 8,"), "profiles.base.settings.gpu_per_node: unknown setting"),
        (GOOD.replace("extends: base", "extends: nowhere"), "profiles.child.extends: no profile 'nowhere'"),
        (GOOD.replace("fallback_profile: generic", "fallback_profile: missing"), "fallback_profile: must name one"),
        (GOOD.replace("{min: 700, unit: TFLOPS}", "{outlier_fraction: 1.5}"),
         "outlier_fraction: must lie in (0, 1], got 1.5"),
    ],
)
def test_broken_files_name_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ThresholdsError) as err:
        load(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_circular_extends(tmp_path: Path) -> None:
    text = GOOD.replace("  base:\n", "  base:\n    extends: child\n")
    with pytest.raises(ThresholdsError, match="circular"):
        load(write(tmp_path, text))


def test_missing_file_and_unknown_profile(tmp_path: Path) -> None:
    with pytest.raises(ThresholdsError, match="file not found; pass an existing file with --thresholds"):
        load(tmp_path / "nope.yaml")
    t = load(write(tmp_path, GOOD))
    with pytest.raises(ThresholdsError, match="no profile 'h300'; profiles are: base, child, generic, cpu"):
        t.profile("h300")


def test_missing_setting_is_a_clear_error(tmp_path: Path) -> None:
    cpu = load(write(tmp_path, GOOD)).profile("cpu")
    with pytest.raises(ThresholdsError, match="profile 'cpu' has no settings.peak_bf16_tflops"):
        cpu.setting("peak_bf16_tflops")
    with pytest.raises(KeyError, match="not a known setting"):
        cpu.setting("warp_speed")


def test_yaml_merge_keys_share_criteria_and_explicit_keys_override_them(tmp_path: Path) -> None:
    """``<<: *anchor`` (the shipped file shares its error-evidence criteria this way) is YAML, not a duplicate."""
    text = GOOD.replace("      gpu_memory_gib: {min: 79}\n",
                        "      gpu_memory_gib: {min: 79}\n      <<: &shared\n        xid_critical_events: {max: 0}\n"
                        "        ecc_corrected_delta: {max: 10}\n") \
        .replace("  cpu: {settings: {gpus_per_node: 0}}\n",
                 "  cpu:\n    settings: {gpus_per_node: 0}\n    metrics:\n      <<: *shared\n"
                 "      ecc_corrected_delta: {max: 50}\n")
    t = load(write(tmp_path, text))
    assert t.profile("base").metrics["xid_critical_events"].get("max") == 0
    assert t.profile("cpu").metrics["xid_critical_events"].get("max") == 0
    assert t.profile("cpu").metrics["ecc_corrected_delta"].get("max") == 50


# ---- bad input is one line: never a traceback, never a hang -----------------------------------------------

BOMB = "schema: 1\nfallback_profile: cpu\ncpu_profile: cpu\nprofiles:\n  cpu:\n    metrics: {x: {min: 1}}\n" \
    "    description:\n" + "".join(
        f"      - &l{i} [{', '.join(['*l' + str(i - 1)] * 9 if i else ['x'] * 9)}]\n" for i in range(9))
"""An alias bomb: nine levels of nine aliases, a billion values once expanded (as str() of the description)."""


@pytest.mark.parametrize(("content", "says"), [
    (b"schema: 1\nprofiles:\n  cpu: {description: \"caf\xe9\"}\n", "not UTF-8 text (byte "),
    (GOOD.replace("extends: base", "extends: [base, generic]").encode(), "profiles.child.extends: must name one "
                                                                         "profile, got ['base', 'generic']"),
    (b"schema: 1\nprofiles:\n  ? [a, b]\n  : {}\n", "a key must be a plain name, not a list or a mapping"),
    (BOMB.encode(), "its aliases expand to more than 200000 values"),
])
def test_a_broken_yaml_file_is_one_error_naming_the_file(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "thresholds.yaml"
    path.write_bytes(content)
    with pytest.raises(ThresholdsError) as caught:
        load(path)
    assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value), caught.value


def test_a_directory_is_not_a_thresholds_file(tmp_path: Path) -> None:
    with pytest.raises(ThresholdsError, match="a directory, not a thresholds file"):
        load(tmp_path)


def test_a_profile_whose_every_criterion_is_empty_is_not_a_sign_off(tmp_path: Path) -> None:
    """It judges nothing: its runs are measured, never signed off (NOT A SIGN-OFF), though it says sign_off."""
    th = load(write(tmp_path, GOOD.replace("cpu: {settings: {gpus_per_node: 0}}",
                                           "cpu: {settings: {gpus_per_node: 0}, metrics: {matmul_bf16_tflops: {}}}")))
    assert th.profile("cpu").sign_off is False and th.profile("base").sign_off is True


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``clustergate ARGS`` (``python -m clustergate``: the same command)."""
    # A hang guard only: each command fails on its first input.
    return subprocess.run([sys.executable, "-m", "clustergate", *args], cwd=ROOT, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)


@pytest.mark.parametrize("bad", ["bomb", "directory"])
def test_every_command_says_a_bad_thresholds_file_in_one_line(tmp_path: Path, bad: str) -> None:
    path = tmp_path if bad == "directory" else tmp_path / "t.yaml"
    if bad == "bomb":
        path.write_text(BOMB)
    node = write_node(tmp_path / "run" / "nodes", "gpu1", node_results("gpu1", 1))
    for args in (["merge", str(node), "-o", str(tmp_path / "run")], ["signoff", str(tmp_path / "run")],
                 ["render", str(node / "results.json"), "-o", str(tmp_path / "r.html")],
                 ["calibrate", str(node / "results.json"), "--extends", "cpu", "-o", str(tmp_path / "s.yaml")]):
        proc = _cli(*args, "--thresholds", str(path))
        assert proc.returncode == 2 and "Traceback" not in proc.stdout, (args, proc.stdout)
        assert len(proc.stdout.strip().splitlines()) == 1, (args, proc.stdout)


@pytest.mark.parametrize("tolerance", ["nan", "-1", "inf"])
def test_a_tolerance_that_is_not_a_relative_change_is_one_line(tmp_path: Path, tolerance: str) -> None:
    node = write_node(tmp_path / "nodes", "gpu1", node_results("gpu1", 1))
    proc = _cli("render", str(node / "results.json"), "--baseline", str(node / "results.json"),
                "--tolerance", tolerance, "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 2 and proc.stdout.strip().splitlines() == [
        f"clustergate render: argument --tolerance: {tolerance!r} is not a relative change of 0 or more "
        "(e.g. 0.05) (see --help)"], proc.stdout


def test_a_run_judged_again_under_a_profile_that_bounds_nothing_is_not_a_sign_off(tmp_path: Path) -> None:
    node = write_node(tmp_path / "nodes", "gpu1", node_results("gpu1", 1)) / "results.json"
    site = tmp_path / "site.yaml"
    data = yaml.safe_load((ROOT / "thresholds.yaml").read_text())
    profile = data["profiles"]["h100-sxm-80gb"]
    profile["metrics"] = {name: {} for name in profile["metrics"]}
    profile.pop("expect", None)
    site.write_text(yaml.safe_dump(data))
    proc = _cli("render", str(node), "--thresholds", str(site), "--json-out", str(tmp_path / "j.json"), "-o",
                str(tmp_path / "r.html"))
    assert proc.returncode == 1, proc.stdout
    judged = json.loads((tmp_path / "j.json").read_text())
    assert judged["verdict"] == "unjudged" and judged["sign_off"] is False
    assert "NOT A SIGN-OFF" in proc.stdout


@pytest.mark.slow  # a torchrun job
def test_a_run_given_a_broken_thresholds_file_stops_saying_why(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(BOMB)
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    r = run_job(tmp_path, [*PLANTED_SUITE, "--thresholds", str(tmp_path / "t.yaml"), "test_x.py"], nproc=1,
                timeout=120)
    assert r.codes == [1], r.output[-3000:]  # the run's 2, in torchrun's summary; torchrun reports 1 (and its trace)
    assert f"ERROR: {tmp_path / 't.yaml'}: its aliases expand to more than 200000 values" in r.output
