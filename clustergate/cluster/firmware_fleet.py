"""Firmware alike across the fleet: every node on the fleet's VBIOS, InfoROM, HCA firmware and driver.

Each node's run holds its own parts to one version (acceptance/test_gpu_firmware.py, test_software_versions_identical)
and keeps a few version strings for the merge (``workloads.gpu.firmware.DETAILS_KEY`` in its tests' details; the
driver in its ``environment``). Here a node whose version of a component differs from the fleet's, the version most
of the fleet's nodes carry, is named with both. Where no version is on more nodes than every other (a fleet split
half and half), every node of the split is named: which half is right is the site's call, not the merge's.

A finding fails the node (it is excluded, as a fleet outlier is), not a warning: a node on other firmware than its
peers passes every figure of its own and still differs from them in what its firmware fixes and how it manages
clocks and power, which a job across nodes meets as one slow or hanging rank; azurehpc-health-checks fails a node
with more than one VBIOS (azure_gpu_vbios.nhc), and the remedy is the same for one node as for one GPU: flash it
to the fleet's version (or, where the odd node is the newer one, the fleet to it) and run the node again.

Pure: ``node_versions`` reads one node run's record into a small mapping (kept per node while merging), ``exclusions``
judges the mappings of the whole fleet: each with its step, ``config_fleet_firmware`` (``clustergate.record.actions``),
where the component, the node's version and the fleet's are named.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from clustergate.cluster.node_runs import Exclusion
from clustergate.record import actions
from workloads.gpu.firmware import DETAILS_KEY

Versions = dict[str, tuple[str, ...]]
"""One node's versions: component (vbios, inforom, inforom_oem, hca_fw[BOARD], driver) -> its distinct versions."""


def node_versions(results: Mapping[str, Any] | None) -> Versions:
    """The firmware and driver versions one node run recorded (empty where it recorded none: a cpu run, a run
    before these tests)."""
    out: Versions = {}
    for test in (results or {}).get("tests") or []:
        found = ((test.get("details") or {}).get(DETAILS_KEY) or {}) if isinstance(test, Mapping) else {}
        for components in found.values() if isinstance(found, Mapping) else ():
            out.update({str(k): tuple(str(v) for v in vs) for k, vs in dict(components).items() if vs})
    driver = ((results or {}).get("environment") or {}).get("driver")
    if driver and out:  # judged where the node's firmware was read: a dry run's driver is no GPU's
        out["driver"] = (str(driver),)
    return out


def _shown(versions: tuple[str, ...]) -> str:
    return " and ".join(versions)


def exclusions(fleet: Mapping[str, Versions]) -> list[Exclusion]:
    """An exclusion for each component on which a host differs from the fleet, by component and then host, with the
    step to align it (no host where it does not differ)."""
    out: list[Exclusion] = []
    components = sorted({c for versions in fleet.values() for c in versions})
    for component in components:
        carried = {host: v[component] for host, v in fleet.items() if component in v}
        counts = Counter(carried.values())
        if len(counts) < 2:
            continue
        (usual, most), *rest = counts.most_common()
        split = rest[0][1] == most
        for host, mine in sorted(carried.items()):
            if mine == usual and not split:
                continue
            if split:
                said = ", ".join(f"{_shown(v)} on {n}" for v, n in counts.most_common())
                why = f"no version is on most of the fleet's {len(carried)} nodes ({said})"
                where = f"{host} {component} {_shown(mine)}; the fleet has none on most of its nodes ({said})"
            else:
                why = f"the fleet's is {_shown(usual)} ({most} of {len(carried)} nodes)"
                where = f"{host} {component} {_shown(mine)}; the fleet's {_shown(usual)}"
            out.append(Exclusion(host, f"fleet firmware: {component} {_shown(mine)} on this node, {why}: flash the "
                                       "node to the fleet's version (or the fleet to one) and run it again",
                                 actions.step("config_fleet_firmware", None, where)))
    return out
