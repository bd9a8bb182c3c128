"""RoCE ports: the GID NCCL will use on each, read from sysfs, and why it would not work.

A RoCE (Ethernet link layer) port addresses its peers by a GID from its table,
``/sys/class/infiniband/<hca>/ports/<port>/gids/<index>`` (sixteen bytes written as eight groups of four hex
digits, all zero where the entry is unused) with its kind in ``gid_attrs/types/<index>`` ("IB/RoCE v1",
"RoCE v2"). The users' most frequent RoCE failure is this GID: an all-zero entry or a RoCEv1 one at the index
NCCL takes (NVIDIA/nccl-tests #192, NVIDIA/nccl #1131).

``nccl_gid_index`` is NCCL's own choice, read from its source (src/transport/net_ib/connect.cc,
``ncclIbGetGidIndex`` and ``ncclUpdateGidIndex``, NCCL 2.28): ``NCCL_IB_GID_INDEX`` when set (>= 0); else,
starting from index 0, each later index replaces the current one when its address family is the wanted one
(``NCCL_IB_ADDR_FAMILY``, AF_INET unless AF_INET6) and the current's is not, or when it is a configured,
non-link-local GID of that family (inside ``NCCL_IB_ADDR_RANGE`` where set) of the wanted RoCE version
(``NCCL_IB_ROCE_VERSION_NUM``, default 2) and the current one is of another version or not valid.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROCE_LINK_LAYER = "Ethernet"
"""What /sys/class/infiniband/<hca>/ports/<port>/link_layer says on a RoCE port."""
ZERO_GID = bytes(16)
_V4_MAPPED = bytes(10) + b"\xff\xff"
_V4_MAPPED_MCAST = b"\xff\x0e" + bytes(8) + b"\xff\xff"
_LINK_LOCAL = b"\xfe\x80" + bytes(6)


@dataclass(frozen=True, slots=True)
class Choice:
    """How NCCL chooses a RoCE GID: from its environment, as NCCL reads it."""

    forced: int | None = None
    """NCCL_IB_GID_INDEX when set to an index (NCCL's default -1: choose)."""
    family: str = "AF_INET"
    """NCCL_IB_ADDR_FAMILY: AF_INET (default) or AF_INET6."""
    version: int = 2
    """NCCL_IB_ROCE_VERSION_NUM (default 2)."""
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    """NCCL_IB_ADDR_RANGE (an address and a prefix length), where set."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Choice:
        """NCCL's reading of its variables: a value it would ignore is ignored here too."""
        forced = _int(env.get("NCCL_IB_GID_INDEX"))
        family = "AF_INET6" if env.get("NCCL_IB_ADDR_FAMILY") == "AF_INET6" else "AF_INET"
        version = _int(env.get("NCCL_IB_ROCE_VERSION_NUM"))
        network = None
        if "/" in (text := env.get("NCCL_IB_ADDR_RANGE") or ""):
            try:
                network = ipaddress.ip_network(text, strict=False)
            except ValueError:
                network = None  # NCCL logs 'is invalid ... ignoring address' and matches every GID
            if network is not None and (network.version == 6) != (family == "AF_INET6"):
                network = None
        return cls(forced=forced if forced is not None and forced >= 0 else None, family=family,
                   version=2 if version is None else version, network=network)

    def said(self) -> str:
        if self.forced is not None:
            return f"NCCL_IB_GID_INDEX={self.forced}"
        rng = f", NCCL_IB_ADDR_RANGE={self.network}" if self.network else ""
        return f"NCCL's own choice (RoCE v{self.version}, {self.family}{rng})"


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None and text.strip() else None
    except ValueError:
        return None


def parse_gid(text: str | None) -> bytes | None:
    """'fe80:0000:...:0001' (sysfs) -> 16 bytes; None for an unreadable or malformed entry."""
    if text is None:
        return None
    groups = text.strip().split(":")
    if len(groups) != 8 or not all(len(g) == 4 for g in groups):
        return None
    try:
        return bytes.fromhex("".join(groups))
    except ValueError:
        return None


def gid_text(gid: bytes | None) -> str:
    """'fe80::a88:66ff:fe01:203', '::ffff:10.0.0.1' (an IPv4 address, as show_gids prints it), or 'missing'."""
    if gid is None:
        return "missing"
    if gid[:12] == _V4_MAPPED:
        return f"::ffff:{ipaddress.IPv4Address(gid[12:])}"
    return str(ipaddress.IPv6Address(gid))


def roce_version(kind: str | None) -> int | None:
    """'RoCE v2' -> 2; 'IB/RoCE v1' or 'RoCE v1' -> 1; anything else (unreadable) -> None."""
    text = (kind or "").strip()
    if text.startswith(("IB/RoCE v1", "RoCE v1")):
        return 1
    return 2 if text.startswith("RoCE v2") else None


def _family(gid: bytes) -> str:
    return "AF_INET" if gid[:12] in (_V4_MAPPED, _V4_MAPPED_MCAST) else "AF_INET6"


def _valid(gid: bytes) -> bool:
    configured = gid != ZERO_GID and gid != _LINK_LOCAL + bytes(8)
    return configured and gid[:8] != _LINK_LOCAL


def _in_range(choice: Choice, gid: bytes) -> bool:
    if choice.network is None:
        return True
    address = ipaddress.IPv4Address(gid[12:]) if choice.network.version == 4 else ipaddress.IPv6Address(gid)
    return address in choice.network


def nccl_gid_index(gids: list[bytes | None], kinds: list[str | None], choice: Choice) -> int:
    """The index NCCL takes on a RoCE port whose table is ``gids`` (None: unreadable) with their ``kinds``."""
    if choice.forced is not None:
        return choice.forced
    best = 0
    for cand in range(1, len(gids)):
        gid, other = gids[best] or ZERO_GID, gids[cand] or ZERO_GID
        fits = _in_range(choice, other)
        if _family(other) != _family(gid) and _family(other) == choice.family and fits:
            best = cand
        elif _family(other) == choice.family and _valid(other) and fits:
            mine, theirs = roce_version(kinds[best]), roce_version(kinds[cand])
            if (mine != theirs or not _valid(gid)) and theirs == choice.version:
                best = cand
    return best


def read_gid_table(port_dir: Path) -> tuple[list[bytes | None], list[str | None]]:
    """A port's GIDs and their kinds, by index (the table's length is the number of entries in gids/)."""
    names = [p.name for p in (port_dir / "gids").glob("*") if p.name.isdigit()]
    size = max((int(n) for n in names), default=-1) + 1
    gids: list[bytes | None] = []
    kinds: list[str | None] = []
    for i in range(size):
        gids.append(parse_gid(_read(port_dir / "gids" / str(i))))
        kinds.append(_read(port_dir / "gid_attrs" / "types" / str(i)))  # EINVAL for an unused entry
    return gids, kinds


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def port_gid(root: Path, device: str, port: int | str, choice: Choice) -> dict[str, Any]:
    """The GID NCCL will use on one RoCE port, and the problem with it (None when there is none)."""
    port_dir = root / "sys/class/infiniband" / device / "ports" / str(port)
    gids, kinds = read_gid_table(port_dir)
    index = nccl_gid_index(gids, kinds, choice)
    gid = gids[index] if 0 <= index < len(gids) else None
    kind = kinds[index] if 0 <= index < len(kinds) else None
    problem = None
    if not gids:
        problem = f"no GID table under {port_dir / 'gids'}"
    elif gid is None:
        problem = f"no GID at index {index} ({len(gids)} entries under {port_dir / 'gids'})"
    elif gid == ZERO_GID:
        problem = f"the GID at index {index} is all zero (no address on the port's network interface?)"
    elif roce_version(kind) != choice.version:
        problem = f"the GID at index {index} is {kind or 'of no readable type'!r}, not RoCE v{choice.version}"
    return {"device": device, "port": port, "gid_index": index, "gid": gid_text(gid), "type": kind,
            "chosen_by": choice.said(), "problem": problem}
