"""What a sign-off says of itself in words, the same on its command's last lines and on its page: what was signed
(``held_to``), the accepted hosts by their hardware (``shapes``), and that a CPU fleet's sign-off is a dry run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clustergate.common.hostlist import compress

DRY_RUN = "DRY RUN, no GPU: CPU ranks under a profile for machines without one; it proves the flow, not a cluster"
"""What the line and the page say first of a sign-off whose fleet ran the cpu profile (the merge's ``dry_run``)."""


def node_shape(node: dict[str, Any]) -> str:
    """A host's hardware as the sign-off says it: "8 x NVIDIA H200", "2 CPU ranks, no GPU"."""
    if node.get("gpus"):
        return f"{node['gpus']} x {', '.join(node.get('gpu_models') or ['GPU of unknown model'])}"
    ranks = node.get("ranks")
    return f"{'?' if ranks is None else ranks} CPU rank{'' if ranks == 1 else 's'}, no GPU"


def shapes(out: dict[str, Any]) -> list[tuple[str, str]]:
    """The accepted hosts grouped by their hardware: (Slurm hostlist, ``node_shape``), the commonest first."""
    groups: dict[str, list[str]] = {}
    for node in out.get("nodes") or []:
        groups.setdefault(node_shape(node), []).append(str(node["host"]))
    return [(compress(hosts), shape) for shape, hosts in sorted(groups.items(), key=lambda g: -len(g[1]))]


def profile_named(out: dict[str, Any]) -> str:
    """The profile as the line and the page name it: a site profile as the site's, with the shipped profile it
    holds to (signoff.json's ``shipped_profile``), never by a shipped name alone."""
    digest = f"digest {out['profile_digest']}" if out.get("profile_digest") else ""
    if out.get("shipped_profile") is None:
        return f"profile {out.get('profile')}" + (f" ({digest})" if digest else "")
    site = f"site profile of {Path(str(out.get('thresholds', '?'))).name}, extends shipped {out['shipped_profile']}"
    return f"profile {out.get('profile')} ({', '.join(filter(None, [site, digest]))})"


def held_to(out: dict[str, Any]) -> str:
    """What the sign-off held the hosts to, in one line: profile, its digest and file, level, suite, site key."""
    key = "signed with the site key" if out.get("signed") else "no site key: the records carry no HMAC"
    return (f"{profile_named(out)} of {out.get('thresholds', '?')}, level {out.get('level')}, "
            f"suite {out.get('suite_digest') or '?'}; {key}")
