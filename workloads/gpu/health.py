"""Health judgements over GPU snapshots: pure functions, no NVML, no GPU.

Each ``check_*`` takes one rank's snapshot (``workloads.gpu.inventory.snapshot``) and returns a
``Check``: ok, fail (with what was seen and what to try) or unsupported (NVML cannot say; the
suite reports it, never passes it). Cross-rank judgements (versions, UUIDs, counts) take every
rank's snapshot and return one ``Check`` per rank. Tests replay captured snapshots through these.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Literal

from workloads.clocks import BAD_CLOCK_EVENTS, reason_names

Status = Literal["ok", "fail", "unsupported"]


@dataclass(frozen=True, slots=True)
class Check:
    status: Status
    message: str
    value: Any = None
    """What was read (JSON-serialisable), for the report's per-rank table."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


OK: Status = "ok"


def _gpu(snap: dict[str, Any], *fields: str) -> tuple[dict[str, Any] | None, Check | None]:
    """The GPU fields, or the Check that explains why they cannot be judged."""
    if snap.get("gpu") is None:
        why = (snap.get("nvml") or {}).get("error") or "no CUDA device"
        return None, Check("fail", f"no GPU on this rank ({why}); check nvidia-smi, the driver, a CUDA build "
                                   "of torch and CUDA_VISIBLE_DEVICES")
    if fields and not snap.get("nvml", {}).get("ok"):
        return None, Check("fail", f"{snap['nvml'].get('error') or 'NVML unavailable'}: cannot read "
                                   f"{', '.join(fields)}; install nvidia-ml-py and check the driver")
    gpu = snap["gpu"]
    for f in fields:
        if f in snap.get("errors", {}):
            return None, Check("fail", f"NVML failed to read {f}: {snap['errors'][f]} (a GPU that errors "
                                       "here may have fallen off the bus: check dmesg for Xid errors)")
    missing = [f for f in fields if f not in gpu]
    if missing:
        why = "; ".join(f"{f}: {snap.get('unsupported', {}).get(f, 'not supported')}" for f in missing)
        return None, Check("unsupported", f"NVML {why}")
    return gpu, None


def check_gpu_present(snap: dict[str, Any]) -> Check:
    """The rank has a GPU CUDA can use (what every per-GPU figure needs first)."""
    gpu, bad = _gpu(snap)
    return bad or Check(OK, f"{gpu['name']}", gpu.get("memory_total_bytes"))  # type: ignore[index]


def check_model(snap: dict[str, Any], expected: str) -> Check:
    gpu, bad = _gpu(snap)
    if bad:
        return bad
    name = gpu["name"]
    if expected.lower() in name.lower():
        return Check(OK, f"{name}", name)
    return Check("fail", f"GPU is {name!r}, the profile expects a name containing {expected!r} "
                         "(wrong node in the job, or choose the right --profile)", name)


def check_ecc_enabled(snap: dict[str, Any]) -> Check:
    gpu, bad = _gpu(snap, "ecc_mode_current")
    if bad:
        return bad
    cur, pending = gpu["ecc_mode_current"], gpu.get("ecc_mode_pending", gpu["ecc_mode_current"])
    value = {"current": cur, "pending": pending}
    if cur:
        note = "" if pending else " (but disabled after the next reboot: pending mode is off)"
        return Check(OK if pending else "fail", f"ECC enabled{note}", value)
    fix = "it is pending, reboot to apply" if pending else "enable with nvidia-smi -e 1 and reboot"
    return Check("fail", f"ECC is disabled ({fix})", value)


def check_no_uncorrectable_ecc(snap: dict[str, Any]) -> Check:
    gpu, bad = _gpu(snap, "ecc_uncorrected_volatile")
    if bad:
        return bad
    n = gpu["ecc_uncorrected_volatile"]
    value = {"uncorrected_volatile": n, "corrected_volatile": gpu.get("ecc_corrected_volatile")}
    if n == 0:
        return Check(OK, "no uncorrectable ECC errors since the driver loaded", value)
    return Check("fail", f"{n} uncorrectable (volatile) ECC errors since the driver loaded: drain the node, "
                         "run dcgmi diag -r 3, RMA the GPU if they recur", value)


def check_no_pending_memory_repair(snap: dict[str, Any]) -> Check:
    """Page retirement (pre-Ampere) or row remapping (Ampere and later) waiting for a GPU reset."""
    sources = {"retired_pages_pending": "page retirement", "remap_pending": "row remapping"}
    judged: dict[str, bool] = {}
    notes: list[str] = []
    for field, what in sources.items():
        gpu, bad = _gpu(snap, field)
        if bad and bad.status == "fail":
            return bad
        if bad:
            notes.append(f"{what}: {bad.message}")
        else:
            judged[field] = bool(gpu[field])
    if not judged:
        return Check("unsupported", "; ".join(notes))
    value = {**judged, "not_supported": notes}
    pending = [sources[f] for f, v in judged.items() if v]
    if pending:
        return Check("fail", f"pending {' and '.join(pending)}: reset the GPU (nvidia-smi -r) or reboot to "
                             "apply it; until then the bad memory is still in use", value)
    return Check(OK, "nothing pending" + (f" ({'; '.join(notes)})" if notes else ""), value)


def check_no_remap_failure(snap: dict[str, Any]) -> Check:
    gpu, bad = _gpu(snap, "remap_failure")
    if bad:
        return bad
    value = {"failure": gpu["remap_failure"], "uncorrectable_rows": gpu.get("remapped_rows_uncorrectable"),
             "correctable_rows": gpu.get("remapped_rows_correctable")}
    if gpu["remap_failure"]:
        return Check("fail", "row remapping failed (no spare rows left): the GPU needs an RMA", value)
    return Check(OK, "no row-remap failure", value)


def check_no_throttle(snap: dict[str, Any]) -> Check:
    gpu, bad = _gpu(snap, "clock_event_reasons")
    if bad:
        return bad
    mask = int(gpu["clock_event_reasons"])
    value = {"reasons": reason_names(mask), "temperature_c": gpu.get("temperature_c"),
             "power_w": gpu.get("power_w"), "sm_clock_mhz": gpu.get("sm_clock_mhz")}
    bad_names = reason_names(mask & BAD_CLOCK_EVENTS)
    if bad_names:
        return Check("fail", f"clocks held down by {', '.join(bad_names)} (temperature "
                             f"{gpu.get('temperature_c')} C, power {gpu.get('power_w')} W): check cooling, "
                             "power supply and the board (nvidia-smi -q -d PERFORMANCE)", value)
    return Check(OK, "no slowdown reason active" + (f" ({', '.join(value['reasons'])})" if mask else ""), value)


def check_pcie_link(snap: dict[str, Any], generation: int | None = None, width: int | None = None, *,
                    idle: bool = False) -> Check:
    """Current link (read under load) at the profile's generation/width, else at the link's maximum.

    ``idle``: the link is read with no load on it (``clustergate health`` runs no CUDA). An idle link trains its
    speed down (Gen1 at idle is normal) but keeps its width, so the generation judged is the most this GPU's link
    can reach in its slot (NVML's maximum: a Gen4 slot or riser shows there), the width as trained. A link that
    fails to train up under load is found only by a reading under load (acceptance test_pcie_link)."""
    gpu, bad = _gpu(snap, "pcie_gen_current", "pcie_width_current", "pcie_gen_max", "pcie_width_max")
    if bad:
        return bad
    want_gen = generation if generation is not None else gpu["pcie_gen_max"]
    want_width = width if width is not None else gpu["pcie_width_max"]
    value = {k: gpu.get(k) for k in ("pcie_gen_current", "pcie_width_current", "pcie_gen_max",
                                     "pcie_width_max", "pcie_gen_gpu_max", "pcie_measured_under_load")}
    gen = gpu["pcie_gen_max"] if idle else gpu["pcie_gen_current"]
    seen = (f"Gen{gen} (the link's maximum; Gen{gpu['pcie_gen_current']} at idle) x{gpu['pcie_width_current']}"
            if idle else f"Gen{gen} x{gpu['pcie_width_current']}")
    want = f"Gen{want_gen} x{want_width}" + (" (profile)" if generation or width else " (link maximum)")
    if gen < want_gen or gpu["pcie_width_current"] < want_width:
        note = "" if idle or gpu.get("pcie_measured_under_load") else " read at idle, when links train down;"
        return Check("fail", f"PCIe link at {seen}, expected {want};{note} reseat the GPU or riser, check the "
                             "slot's BIOS setting and the link max "
                             f"Gen{gpu['pcie_gen_max']} x{gpu['pcie_width_max']}", value)
    return Check(OK, f"PCIe {seen}", value)


def check_nvlinks(snap: dict[str, Any], expected: int | None = None) -> Check:
    """Active NVLinks equal the profile's count; without one, every link NVML lists must be active."""
    gpu, bad = _gpu(snap, "nvlink_states")
    if bad and bad.status == "unsupported":
        # NVML lists no link: none active, said as figures too, so a reader of the table (calibrate) needs no words.
        none = {"active": 0, "present": 0, "down": []}
        if expected:
            return Check("fail", f"{bad.message}, but the profile expects {expected} active links", none)
        return Check(bad.status, bad.message, none)
    if bad:
        return bad
    states = gpu["nvlink_states"]
    active = [s["link"] for s in states if s["active"]]
    down = [s["link"] for s in states if not s["active"]]
    value = {"active": len(active), "present": len(states), "down": down}
    want = expected if expected is not None else len(states)
    if len(active) < want or (expected is None and down):
        return Check("fail", f"{len(active)} of {want} NVLinks active" + (f", links {down} down" if down else "")
                     + ": check nvidia-smi nvlink -s and the fabric manager; reseat or RMA the board", value)
    return Check(OK, f"{len(active)} NVLinks active", value)


def check_mig_mode(snap: dict[str, Any], expected: str) -> Check:
    gpu, bad = _gpu(snap, "mig_mode_current")
    if bad:
        if bad.status == "unsupported" and expected == "disabled":
            return Check(OK, f"MIG not supported on this GPU, hence disabled ({bad.message})", None)
        return bad
    mode = "enabled" if gpu["mig_mode_current"] else "disabled"
    pending = "enabled" if gpu.get("mig_mode_pending", gpu["mig_mode_current"]) else "disabled"
    value = {"current": mode, "pending": pending}
    if mode != expected:
        return Check("fail", f"MIG mode {mode}, the profile expects {expected} "
                             f"(nvidia-smi -i <index> -mig {1 if expected == 'enabled' else 0}, then reset)", value)
    if pending != expected:
        return Check("fail", f"MIG mode {mode} now but {pending} after the next reset", value)
    return Check(OK, f"MIG {mode}", value)


# ---- across ranks --------------------------------------------------------------------------

VERSION_KEYS = ("driver", "cuda_driver", "torch_cuda", "nccl")


def check_versions_identical(snaps: list[dict[str, Any]]) -> list[Check]:
    """Driver, CUDA (driver and torch's runtime) and NCCL the same on every rank; odd ones out fail."""
    versions = [{k: s.get("software", {}).get(k) for k in VERSION_KEYS} for s in snaps]
    common = {k: Counter(v[k] for v in versions).most_common(1)[0][0] for k in VERSION_KEYS}
    checks: list[Check] = []
    for snap, mine in zip(snaps, versions, strict=True):
        missing = [k for k in VERSION_KEYS if mine[k] is None]
        differ = [f"{k} {mine[k]} (most ranks: {common[k]})" for k in VERSION_KEYS
                  if mine[k] is not None and mine[k] != common[k]]
        if differ:
            checks.append(Check("fail", f"{snap.get('host')}: {'; '.join(differ)}: install the same driver, "
                                        "CUDA and torch/NCCL on every node", mine))
        elif missing:
            why = (snap.get("nvml") or {}).get("error") or "not reported"
            checks.append(Check("fail", f"{', '.join(missing)} unknown: {why}", mine))
        else:
            checks.append(Check(OK, ", ".join(f"{k} {mine[k]}" for k in VERSION_KEYS), mine))
    return checks


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def check_driver_at_least(snap: dict[str, Any], minimum: str) -> Check:
    driver = snap.get("software", {}).get("driver")
    if driver is None:
        return Check("fail", f"driver version unknown ({(snap.get('nvml') or {}).get('error')}); "
                             f"the profile requires >= {minimum}")
    if _version_tuple(driver) < _version_tuple(minimum):
        return Check("fail", f"driver {driver} is older than the profile's minimum {minimum}: upgrade it", driver)
    return Check(OK, f"driver {driver} >= {minimum}", driver)


def check_uuids_distinct(snaps: list[dict[str, Any]]) -> list[Check]:
    """Every rank on its own GPU: a UUID seen on two ranks means two ranks share a GPU."""
    uuids = [(s.get("gpu") or {}).get("uuid") for s in snaps]
    owners: dict[str, list[int]] = {}
    for rank, uuid in enumerate(uuids):
        if uuid:
            owners.setdefault(uuid, []).append(rank)
    checks = []
    for snap, uuid in zip(snaps, uuids, strict=True):
        if snap.get("gpu") is None:
            checks.append(_gpu(snap)[1])  # type: ignore[arg-type]
        elif not uuid:
            checks.append(Check("unsupported", "GPU UUID unknown (CUDA and NVML did not report one)"))
        elif len(owners[uuid]) > 1:
            checks.append(Check("fail", f"ranks {owners[uuid]} share GPU {uuid} (local rank "
                                        f"{snap.get('local_rank')}): set one device per rank "
                                        "(LOCAL_RANK -> cuda:LOCAL_RANK; check CUDA_VISIBLE_DEVICES)", uuid))
        else:
            checks.append(Check(OK, uuid, uuid))
    return checks


def gpu_count_checks(snaps: list[dict[str, Any]], expected: int | None) -> list[Check]:
    """GPUs per node as CUDA sees them (the node's lowest rank speaks for it), against the profile."""
    first_of_node: dict[Any, int] = {}
    for rank, s in enumerate(snaps):
        first_of_node.setdefault((s.get("node_rank"), s.get("host")), rank)
    checks = []
    for rank, s in enumerate(snaps):
        cuda = s.get("cuda_device_count", 0)
        nvml = (s.get("nvml") or {}).get("device_count")
        value = {"cuda": cuda, "nvml": nvml}
        problems = []
        if expected is not None and cuda != expected:
            problems.append(f"{cuda} GPUs visible to CUDA, the profile expects {expected}"
                            + (" (no GPU at all: is the driver loaded? run nvidia-smi)" if cuda == 0 else ""))
        if nvml is not None and nvml != cuda and s.get("cuda_visible_devices") is None:
            problems.append(f"NVML lists {nvml} GPUs but CUDA sees {cuda} (CUDA_VISIBLE_DEVICES, or a GPU "
                            "NVML lists but CUDA cannot use: check nvidia-smi and dmesg for Xid 79)")
        if problems and rank == first_of_node[(s.get("node_rank"), s.get("host"))]:
            checks.append(Check("fail", f"{s.get('host')}: " + "; ".join(problems), value))
        else:
            checks.append(Check(OK, f"{s.get('host')}: {cuda} GPUs", value))
    return checks
