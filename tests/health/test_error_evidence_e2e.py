"""End to end under torchrun on gloo: the error-evidence tests read a captured sysfs tree
(CLUSTERGATE_HOST_ROOT) before and after, and a counter planted in between rejects the run naming the
device or port, the counter with both values and the next step; untouched, the same run accepts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from torchrun_job import PLANTED_SUITE, ROOT, JobResult, run_job

DATA = Path(__file__).parents[1] / "data"
FAULT = Path(__file__).parents[1] / "faults/hw_counters.py"

pytestmark = pytest.mark.slow


def job(tmp_path: Path, plant: str) -> JobResult:
    tree = tmp_path / "host"
    for sample in ("aer", "ib"):
        shutil.copytree(DATA / sample, tree, dirs_exist_ok=True)
    shutil.copy(FAULT, tmp_path / "test_fault.py")
    # The captured tree is a GPU node's (an NVIDIA GPU on its PCI bus): only --profile cpu runs the CPU suite on it,
    # and only as a dry run.
    return run_job(tmp_path, [*PLANTED_SUITE, "--thresholds", str(ROOT / "thresholds.yaml"), "--profile", "cpu",
                              "--dry-run", "test_fault.py"],
                   env={"CLUSTERGATE_HOST_ROOT": str(tree), "CLUSTERGATE_TEST_PLANT": plant})


def test_untouched_counters_accept(tmp_path: Path) -> None:
    r = job(tmp_path, "")
    assert r.codes == [0], r.output
    res = r.results
    assert [t["outcome"] for t in res["tests"]] == ["passed"] * 4
    [node] = res["hardware_inventory"]["nodes"]
    assert node["aer_devices"] == 3 and sorted(node["ib_ports"]) == ["mlx5_0 port 1", "mlx5_1 port 1",
                                                                     "mlx5_bond_0 port 1"]
    ib = next(t for t in res["tests"] if t["nodeid"].endswith("test_infiniband_errors_during_run"))
    assert {m["name"]: m["value"] for m in ib["metrics"]}["ib_link_downed_delta"] == 0


def test_planted_aer_error_and_link_down_reject_naming_the_part(tmp_path: Path) -> None:
    r = job(tmp_path, "aer_fatal,ib_down")
    assert r.codes == [1], r.output
    res = r.results
    tests = {t["nodeid"].split("::")[1]: t for t in res["tests"]}
    aer, ib = tests["test_pcie_aer_errors_during_run"], tests["test_infiniband_errors_during_run"]
    assert res["verdict"] == "reject" and aer["outcome"] == ib["outcome"] == "failed"
    assert aer["failed_ranks"] == [0]  # the node's local rank 0 read and owns the node's devices
    assert ("pcie_aer_fatal_delta=1 count, expected <= 0 [cpu, node 0" in aer["message"]
            and "0000:3b:00.0 (NVIDIA Networking (Mellanox) InfiniBand NIC): fatal.TOTAL_ERR_FATAL 0 -> 1 (+1); "
                "fatal.CmpltTO 0 -> 1 (+1). Next step: PCIe fatal uncorrectable errors (AER): reseat" in aer["message"])
    assert "mlx5_0 port 1: link_downed 1 -> 2 (+1). Next step: an InfiniBand link went down" in ib["message"]
    assert "mlx5_0 port 1: state ACTIVE -> DOWN" in ib["message"]
    # a warn-level counter that did not grow stays quiet; the saturated one is said, not judged as growth
    rows = {(row["metric"], row["label"]): row for row in ib["details"]["evidence"]}
    assert rows["ib_symbol_error_delta", "mlx5_1 port 1"]["value"] == 0
    html = (r.report_dir / "report.html").read_text()
    assert "<h3>For vendor support</h3>" in html and "Error counters that grew during the run" in html
