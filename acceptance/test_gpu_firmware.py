"""Firmware alike: every GPU's VBIOS and InfoROM, and every HCA's firmware, one version per node (and one per fleet
at merge: clustergate/cluster/firmware_fleet.py), at or above the profile's minimum where it names one.

A part on another version than its node's others fails, named with its host, GPU index and serial (or HCA) and
both versions (workloads.gpu.firmware). The driver's one version per node is test_software_versions_identical's
(test_gpu_inventory.py). Under the cpu profile the GPU test skips (no GPU); a node without an HCA skips the HCA
test on that fact.
"""

from __future__ import annotations

from acceptance.gpu_helpers import settle, skip_on_cpu_profile, snapshots
from clustergate.run.recorder import Recorder
from workloads.gpu import firmware
from workloads.node.discovery import host_root
from workloads.result import Result


def _minimum(cg: Recorder, component: str) -> str | None:
    value = cg.setting(firmware.MINIMUM_SETTINGS[component], None)
    return str(value) if value is not None else None


def test_gpu_firmware_alike(cg: Recorder) -> None:
    """VBIOS and InfoROM (image and OEM object) the same on every GPU of a node, at or above min_vbios_version
    and min_inforom_version where the profile sets them (azurehpc-health-checks: azure_gpu_vbios.nhc)."""
    skip_on_cpu_profile(cg)
    snaps = snapshots(cg)
    cg.record_result(Result(metrics=(), details={firmware.DETAILS_KEY: firmware.versions(snaps, {})}))
    minimums = {c: _minimum(cg, c) for c in ("vbios", "inforom")}
    settle(cg, firmware.gpu_checks(snaps, minimums), "gpu_firmware")


def test_hca_firmware_alike(cg: Recorder) -> None:
    """Every HCA's firmware (/sys/class/infiniband/*/fw_ver) the same as its node's other HCAs of the same board id,
    at or above min_hca_firmware_version where the profile sets it (Meta's GCM checks HCA firmware)."""
    host = cg.identities[cg.rank]["host"]
    everyone = cg.all_ranks((host, firmware.read_hcas(host_root())))
    by_host = dict(everyone)
    cg.skip_unless_everywhere(bool(by_host[host]), f"{host}: no HCA under {host_root() / 'sys/class/infiniband'}",
                              fact="no_infiniband")
    cg.record_result(Result(metrics=(), details={firmware.DETAILS_KEY: firmware.versions([], by_host)}))
    minimum = _minimum(cg, "hca_fw")
    settle(cg, [firmware.hca_check(h, hcas, minimum) for h, hcas in everyone], "hca_firmware")
