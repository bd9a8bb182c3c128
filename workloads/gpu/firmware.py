"""Firmware alike: each GPU's VBIOS and InfoROM and each HCA's firmware one version per node, at or above a minimum.

The readings come from NVML (``workloads.gpu.inventory`` reads the VBIOS and the InfoROM's image and OEM versions
into every snapshot) and from sysfs (``/sys/class/infiniband/<hca>/fw_ver`` and ``board_id``); every judgement is a
pure function over them, so captured readings replay without a GPU or an HCA. One part on another version than its
node's others runs other firmware than its peers (other errata, other power and clock tables): azurehpc-health-checks
fails a node with more than one VBIOS (``azure_gpu_vbios.nhc``), Meta's GCM checks VBIOS and HCA firmware. HCAs are
compared within their board id (their PSID: a storage NIC of another model carries other firmware by design).

``versions`` is what a node's run keeps of it for the merge (``clustergate.cluster.firmware_fleet``): a few version
strings per node, under ``DETAILS_KEY`` in the test's details.

Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.firmware
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workloads.gpu.health import OK, Check

DETAILS_KEY = "firmware_versions"
"""Where a node run's details keep ``{host: {component: [version, ...]}}`` for the merge."""
GPU_FIELDS = {"vbios": "vbios_version", "inforom": "inforom_image_version", "inforom_oem": "inforom_oem_version"}
"""The firmware of a GPU this suite compares, by the name a finding uses and the snapshot field that holds it."""
MINIMUM_SETTINGS = {"vbios": "min_vbios_version", "inforom": "min_inforom_version",
                    "hca_fw": "min_hca_firmware_version"}
"""The profile setting that names a component's lowest acceptable version (none set in the shipped profiles)."""


def version_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """An order for firmware versions: parts split at '.', '-' or '_', each compared as a hexadecimal number where
    it is one (VBIOS 96.00.A5.00.1A is hexadecimal; a decimal part orders the same read as hexadecimal), as text
    where it is not (InfoROM G520)."""
    out: list[tuple[int, int | str]] = []
    for part in re.split(r"[._-]", text.strip()):
        out.append((0, int(part, 16)) if re.fullmatch(r"[0-9A-Fa-f]+", part) else (1, part))
    return tuple(out)


def read_hcas(root: Path) -> list[dict[str, Any]]:
    """Every HCA under ``root``/sys/class/infiniband: its name, firmware version and board id (None where the
    file is absent or unreadable)."""
    out = []
    for hca in sorted((root / "sys/class/infiniband").glob("*")):
        out.append({"hca": hca.name, "fw_ver": _read(hca / "fw_ver"), "board_id": _read(hca / "board_id")})
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _gpu_part(snap: dict[str, Any]) -> str:
    gpu = snap.get("gpu") or {}
    serial = f" (serial {gpu['serial']})" if gpu.get("serial") else ""
    return f"gpu {gpu.get('index', snap.get('local_rank', '?'))}{serial}"


def _most_common(values: Iterable[str]) -> str:
    """The version most of a node's parts carry (the first seen of a tie: the parts' own order decides)."""
    return Counter(values).most_common(1)[0][0]


def gpu_checks(snaps: list[dict[str, Any]], minimums: dict[str, str | None]) -> list[Check]:
    """Per rank: its GPU's VBIOS and InfoROM versions are those of the other GPUs of its node, and at or above the
    profile's minimum (``minimums``: component -> version or None). A GPU whose NVML cannot say is unsupported,
    never passed."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for snap in snaps:
        by_host.setdefault(str(snap.get("host")), []).append(snap)
    checks = []
    for snap in snaps:
        gpu = snap.get("gpu")
        if gpu is None or not (snap.get("nvml") or {}).get("ok"):
            checks.append(Check("fail", f"no GPU reading: {(snap.get('nvml') or {}).get('error')}"))
            continue
        host = str(snap.get("host"))
        peers = by_host[host]
        problems, unsupported, seen = [], [], {}
        for name, field in GPU_FIELDS.items():
            mine = gpu.get(field)
            if mine is None:
                why = (snap.get("unsupported") or {}).get(field) or (snap.get("errors") or {}).get(field)
                unsupported.append(f"{name}: {why}")
                continue
            seen[name] = mine
            node = _most_common(v for p in peers if (v := (p.get("gpu") or {}).get(field)) is not None)
            if mine != node:
                problems.append(f"{name} {mine}, the node's other GPUs {node}")
            if (minimum := minimums.get(name)) and version_key(mine) < version_key(minimum):
                problems.append(f"{name} {mine} is below the profile's minimum {minimum}")
        if problems:
            checks.append(Check("fail", f"{host} {_gpu_part(snap)}: {'; '.join(problems)}: flash the node's GPUs to "
                                        "one firmware (nvidia-smi -q shows each GPU's VBIOS and InfoROM)", seen))
        elif not seen:
            checks.append(Check("unsupported", f"NVML cannot read {'; '.join(unsupported)}", seen))
        else:  # what NVML reads is judged; what it cannot (an InfoROM object a VM hides) is said beside it
            also = f" (NVML cannot read {'; '.join(unsupported)})" if unsupported else ""
            checks.append(Check(OK, ", ".join(f"{k} {v}" for k, v in seen.items()) + also, seen))
    return checks


def hca_check(host: str, hcas: list[dict[str, Any]], minimum: str | None) -> Check:
    """A node's HCAs: one firmware version per board id, at or above the profile's minimum (unsupported where the
    node has none: nothing to judge, never a pass)."""
    if not hcas:
        return Check("unsupported", f"{host}: no HCA under /sys/class/infiniband")
    unreadable = [h["hca"] for h in hcas if h.get("fw_ver") is None]
    readable = [h for h in hcas if h.get("fw_ver") is not None]
    problems = []
    for board in sorted({str(h.get("board_id") or "") for h in readable}):
        alike = [h for h in readable if str(h.get("board_id") or "") == board]
        node = _most_common(h["fw_ver"] for h in alike)
        problems += [f"{h['hca']}{f' (board {board})' if board else ''} firmware {h['fw_ver']}, the node's other "
                     f"HCAs{f' of board {board}' if board else ''} {node}" for h in alike if h["fw_ver"] != node]
    if minimum:
        problems += [f"{h['hca']} firmware {h['fw_ver']} is below the profile's minimum {minimum}"
                     for h in readable if version_key(h["fw_ver"]) < version_key(minimum)]
    value = {h["hca"]: h.get("fw_ver") for h in hcas}
    if problems:
        return Check("fail", f"{host}: {'; '.join(problems)}: flash every HCA of a model to one firmware "
                             "(mlxfwmanager / flint -d DEVICE query)", value)
    if unreadable:
        return Check("unsupported", f"{host}: no fw_ver for {', '.join(unreadable)} under /sys/class/infiniband",
                     value)
    return Check(OK, ", ".join(f"{h['hca']} {h['fw_ver']}" for h in readable), value)


def versions(snaps: list[dict[str, Any]], hcas: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list[str]]]:
    """What a run keeps for the merge: per host, each component's distinct versions (one where the node is alike).
    HCA firmware is named per board id (``hca_fw`` alone where the HCA reports none)."""
    out: dict[str, dict[str, set[str]]] = {}
    for snap in snaps:
        gpu = snap.get("gpu") or {}
        mine = out.setdefault(str(snap.get("host")), {})
        for name, field in GPU_FIELDS.items():
            if gpu.get(field) is not None:
                mine.setdefault(name, set()).add(str(gpu[field]))
    for host, found in hcas.items():
        mine = out.setdefault(host, {})
        for h in found:
            if h.get("fw_ver") is not None:
                key = f"hca_fw[{h['board_id']}]" if h.get("board_id") else "hca_fw"
                mine.setdefault(key, set()).add(str(h["fw_ver"]))
    return {host: {k: sorted(v) for k, v in sorted(comps.items())} for host, comps in sorted(out.items())}


def main() -> None:
    """Print this node's firmware readings and what they are judged to (every rank's GPU, this node's HCAs)."""
    from workloads.common import distributed, gather_objects
    from workloads.gpu import inventory
    from workloads.node.discovery import host_root

    with distributed() as here:
        snaps = gather_objects(inventory.snapshot(here.device))
        hcas = read_hcas(host_root())
        if here.rank == 0:
            checks = gpu_checks(snaps, {})
            print(json.dumps({"gpus": [c.as_dict() for c in checks],
                              "hcas": hca_check(str(snaps[0].get("host")), hcas, None).as_dict(),
                              "versions": versions(snaps, {str(snaps[0].get("host")): hcas})}, indent=1))


if __name__ == "__main__":
    main()
