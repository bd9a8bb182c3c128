"""Which NIC is each GPU's own: ``nvidia-smi topo -m`` read by its header, judged against the node's shape.

``nvidia-smi topo -m`` prints a matrix: a header naming every device column (``GPU0``.., ``NIC0``.., in old
drivers the NIC's own name such as ``mlx5_0``) and then ``CPU Affinity``, ``NUMA Affinity`` and ``GPU NUMA ID``;
one row per device whose cells say how two devices connect (``X`` itself, ``NV#`` NVLinks, and the PCIe
distances ``PIX`` < ``PXB`` < ``PHB`` < ``NODE`` < ``SYS``); then a ``Legend`` and a ``NIC Legend``
(``NIC0: mlx5_0``). Cells are read by the header's names, never by a fixed position: the affinity columns
contain spaces and the NIC columns vary in number. Samples: tests/data/topology/ (their README names the source).

A GPU's nearest NIC is the one at the least PCIe distance; on a rail-optimised node (a NIC per GPU, NCCL's
design for NDR and RoCE fabrics) each GPU has its own, under the same PCIe switch (PIX or PXB) and so on the
GPU's NUMA node. ``SYS`` crosses the CPUs' interconnect: the NIC is on the other NUMA node.

Run alone: python -m workloads.node.topology [FILE]   (no FILE: runs nvidia-smi topo -m)
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DISTANCES = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""PCIe distances, nearest first (nvidia-smi's legend; NCCL's PATH_PIX .. PATH_SYS in the same order)."""
ALIASES = {"SOC": "SYS"}
"""Older drivers' name of SYS (CUDA 8's nvidia-smi)."""
_AFFINITY = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")
_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


class TopologyError(ValueError):
    """The text is not an ``nvidia-smi topo -m`` matrix (the message says what was missing)."""


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    distances: dict[str, str]
    """NIC column -> distance word (PIX .. SYS) as the GPU's row shows it."""
    numa: int | None
    """The row's NUMA Affinity (None: N/A, empty, or a list of several nodes)."""


@dataclass(frozen=True, slots=True)
class Topology:
    gpus: tuple[Gpu, ...]
    nics: tuple[str, ...]
    """NIC columns in the header's order (NIC0 .. or the NIC's name in old formats)."""
    names: dict[str, str] = field(default_factory=dict)
    """NIC column -> device name from the NIC Legend (mlx5_0); a column without one is its own name."""

    def name(self, nic: str) -> str:
        return self.names.get(nic, nic)

    def nearest(self, gpu: Gpu) -> tuple[str | None, list[str]]:
        """The least distance from ``gpu`` to any NIC and the NICs at it (None, [] without a NIC)."""
        ranked = [(DISTANCES.index(d), nic) for nic, d in gpu.distances.items() if d in DISTANCES]
        if not ranked:
            return None, []
        best = min(r for r, _ in ranked)
        return DISTANCES[best], [nic for r, nic in ranked if r == best]


def _header(lines: list[str]) -> tuple[int, list[str], list[str]]:
    """Index of the header line, its device columns and the affinity columns it has, in order."""
    for i, line in enumerate(lines):
        words = line.split()
        if words and words[0] == "GPU0":
            text = " ".join(words)
            affinity = sorted((a for a in _AFFINITY if a in text), key=text.index)
            cut = min((text.index(a) for a in affinity), default=len(text))
            return i, text[:cut].split(), affinity
    raise TopologyError("no header line starting with GPU0: not nvidia-smi topo -m output")


def _numa(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def parse(text: str) -> Topology:
    """The GPUs' rows, the NIC columns and the NIC Legend of ``nvidia-smi topo -m``."""
    # nvidia-smi underlines the header with terminal escapes even into a pipe (seen on a lent H200, driver
    # 580.159.04): without them stripped the header's first word is "\x1b[4mGPU0" and GPU0's row is taken for it.
    lines = _ESCAPES.sub("", text).splitlines()
    at, devices, affinity = _header(lines)
    nics = tuple(d for d in devices if not re.fullmatch(r"GPU\d+", d))
    gpus = []
    for line in lines[at + 1:]:
        words = line.split()
        if not words or not re.fullmatch(r"GPU\d+", words[0]):
            if gpus:
                break  # the GPU rows end where the NIC rows (or the legend) begin
            continue
        cells, rest = words[1:1 + len(devices)], words[1 + len(devices):]
        if len(cells) < len(devices):
            raise TopologyError(f"row {words[0]} has {len(cells)} cells for the header's {len(devices)} devices")
        named = dict(zip(devices, cells, strict=True))
        extra = dict(zip(affinity, rest, strict=False))
        gpus.append(Gpu(index=int(words[0][3:]),
                        distances={n: ALIASES.get(named[n], named[n]) for n in nics},
                        numa=_numa(extra.get("NUMA Affinity"))))
    if not gpus:
        raise TopologyError("no GPU rows under the header")
    names = {m.group(1): m.group(2) for line in lines if (m := _LEGEND.match(line))}
    return Topology(gpus=tuple(gpus), nics=nics, names=names)


@dataclass(frozen=True, slots=True)
class Shape:
    """What the profile says a node has (thresholds.yaml settings)."""

    nics_per_node: int
    """NICs for GPU traffic a node must have; at least one a GPU means every GPU needs its own."""
    max_distance: str = "PXB"
    """The farthest a GPU's own NIC may be (NCCL's default GPUDirect RDMA level, NCCL_NET_GDR_LEVEL, is PXB)."""

    def __post_init__(self) -> None:
        if self.max_distance not in DISTANCES:
            raise ValueError(f"max_distance={self.max_distance!r}: one of {', '.join(DISTANCES)}")


def assign(topo: Topology) -> dict[int, dict[str, Any]]:
    """Each GPU's own NIC: its nearest, a NIC at the same least distance another GPU has not taken where there are
    several (a GPU with one nearest NIC claims it first). Per GPU index: nic, name, distance, shared_with."""
    near = {g.index: topo.nearest(g) for g in topo.gpus}
    taken: dict[str, int] = {}
    out: dict[int, dict[str, Any]] = {}
    for g in sorted(topo.gpus, key=lambda g: (len(near[g.index][1]), g.index)):
        distance, nics = near[g.index]
        free = [n for n in nics if n not in taken]
        nic = (free or nics or [None])[0]
        out[g.index] = {"nic": nic, "name": topo.name(nic) if nic else None, "distance": distance,
                        "numa": g.numa, "shared_with": taken.get(nic) if nic in taken else None}
        if nic is not None:
            taken.setdefault(nic, g.index)
    return dict(sorted(out.items()))


def problems(topo: Topology, shape: Shape, host: str, nic_numa: dict[str, int] | None = None) -> list[str]:
    """What breaks ``shape``: each names the host, the GPU, the NIC and the distance. ``nic_numa``: a NIC's NUMA
    node by device name (/sys/class/infiniband/NAME/device/numa_node) where it could be read; elsewhere a NIC at
    SYS from its GPU is on another NUMA node (nvidia-smi's legend: SYS crosses the SMP interconnect)."""
    own = assign(topo)
    per_gpu = shape.nics_per_node >= len(topo.gpus)
    out = []
    if len(topo.nics) < shape.nics_per_node:
        out.append(f"{host}: nvidia-smi topo -m shows {len(topo.nics)} NICs, the profile's node has "
                   f"{shape.nics_per_node} (settings.nics_per_node)")
    limit = DISTANCES.index(shape.max_distance)
    for index, a in own.items():
        where = f"{host} GPU {index}"
        if a["nic"] is None:
            out.append(f"{where}: no NIC in nvidia-smi topo -m's row")
            continue
        nic = f"{a['nic']} ({a['name']})" if a["name"] != a["nic"] else a["nic"]
        if DISTANCES.index(a["distance"]) > limit:
            numa_note = (f"; SYS crosses the CPUs' interconnect: the NIC is on another NUMA node than the GPU's "
                         f"({a['numa'] if a['numa'] is not None else 'unknown'})" if a["distance"] == "SYS" else "")
            out.append(f"{where}: its nearest NIC {nic} is at {a['distance']}, farther than "
                       f"{shape.max_distance} (PCIe distances nearest first: {', '.join(DISTANCES)}){numa_note}")
        if per_gpu and a["shared_with"] is not None:
            out.append(f"{where}: its nearest NIC {nic} at {a['distance']} is already GPU {a['shared_with']}'s; "
                       f"the profile's node has a NIC per GPU ({shape.nics_per_node} NICs for {len(topo.gpus)} GPUs)")
        numa = (nic_numa or {}).get(a["name"])
        if numa is not None and a["numa"] is not None and numa != a["numa"]:
            out.append(f"{where}: its nearest NIC {nic} at {a['distance']} is on NUMA node {numa}, the GPU on "
                       f"{a['numa']}")
        elif numa is None and a["distance"] == "SYS" and limit == DISTANCES.index("SYS"):
            out.append(f"{where}: its nearest NIC {nic} is at SYS: on another NUMA node than the GPU's "
                       f"({a['numa'] if a['numa'] is not None else 'unknown'})")
    return out


def nic_numa_nodes(names: list[str], root: Path = Path("/")) -> dict[str, int]:
    """NUMA node of each RDMA device name from /sys/class/infiniband/NAME/device/numa_node (-1 or absent: left out)."""
    out = {}
    for name in names:
        try:
            value = int((root / "sys/class/infiniband" / name / "device/numa_node").read_text().strip())
        except (OSError, ValueError):
            continue
        if value >= 0:
            out[name] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", help="a saved nvidia-smi topo -m (default: run it)")
    parser.add_argument("--nics-per-node", type=int, default=8)
    args = parser.parse_args()
    if args.file:
        text = Path(args.file).read_text()
    else:
        from workloads.node.discovery import nvidia_smi_topology

        seen = nvidia_smi_topology()
        if seen["text"] is None:
            sys.exit(seen["error"])
        text = seen["text"]
    topo = parse(text)
    for index, a in assign(topo).items():
        print(f"GPU {index}: NIC {a['nic']} ({a['name']}) at {a['distance']}, NUMA {a['numa']}")
    names = [topo.name(n) for n in topo.nics]
    print("\n".join(problems(topo, Shape(args.nics_per_node), "this host", nic_numa_nodes(names))) or "ok")


if __name__ == "__main__":
    main()
