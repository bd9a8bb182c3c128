"""Slurm hostlist form, both ways, and --expect-hosts input (clustergate.common.hostlist)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from clustergate.common.hostlist import HostlistError, compress, expand, read_hosts


@pytest.mark.parametrize(("hosts", "text"), [
    ([f"gpu{i:03d}" for i in (1, 2, 3, 4, 5, 6, 7, 9)], "gpu[001-007,009]"),
    (["node9", "node10", "node11"], "node[9-11]"),  # no padding: the width may grow
    (["gpu099", "gpu100", "gpu101"], "gpu[099-101]"),  # 100 has the padded width: one group
    (["gpu001"], "gpu001"),
    (["login", "gpu-a08", "gpu-a07"], "gpu-a[07-08],login"),
    (["r1n1.cluster", "r1n2.cluster"], "r1n[1-2].cluster"),
    ([], ""),
])
def test_compress(hosts: list[str], text: str) -> None:
    assert compress(hosts) == text
    assert sorted(expand(text)) == sorted(set(hosts))


def test_expand_slurm_forms() -> None:
    assert expand("gpu[001-003],login1") == ["gpu001", "gpu002", "gpu003", "login1"]
    assert expand("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]
    assert expand(" a[1,3-4] , b ") == ["a1", "a3", "a4", "b"]


def test_round_trip_of_random_fleets() -> None:
    rng = random.Random(7)
    for _ in range(200):
        hosts = {f"{rng.choice(['gpu', 'node-', 'h100-r'])}{rng.randint(0, 1200):0{rng.choice([1, 3, 4])}d}"
                 for _ in range(rng.randint(1, 60))}
        assert sorted(expand(compress(hosts))) == sorted(hosts)


@pytest.mark.parametrize(("text", "message"), [
    ("gpu[1-", "never closed"),
    ("gpu1-2]", "']' without '['"),
    ("gpu[a-b]", "'a-b' in [...] is not a number"),
    ("gpu[5-1]", "runs backwards"),
    ("gpu[[1]]", "nested"),
    ("gpu[1-99999999]", "more than 1000000 names"),
])
def test_bad_expressions_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(HostlistError, match=message.replace("[", r"\[").replace("]", r"\]")):
        expand(text)


def test_expected_hosts_from_a_file_or_an_expression(tmp_path: Path) -> None:
    f = tmp_path / "hosts.txt"
    f.write_text("# the allocation\ngpu[001-002]\n\ngpu010  # spare\n")
    assert read_hosts(str(f)) == (["gpu001", "gpu002", "gpu010"], str(f))
    assert read_hosts("gpu[7-8]") == (["gpu7", "gpu8"], "hostlist expression")
    f.write_text("ok1\nbad[\n")
    with pytest.raises(HostlistError, match="hosts.txt, line 2"):
        read_hosts(str(f))
    with pytest.raises(HostlistError, match="no such file"):
        read_hosts(str(tmp_path / "missing.txt"))
