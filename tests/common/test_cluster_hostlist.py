"""Slurm hostlist form, both ways, and --expect-hosts input (clustergate.common.hostlist)."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustergate.common.exit_codes import Exit
from clustergate.common.hostlist import MAX_EXPANDED, HostlistError, compress, expand, read_hosts

from torchrun_job import ROOT, job_env


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
    ("gpu[1-99999999]", "'gpu[1-99999999]' names 99999999 hosts, more than the 100000 a host expression may name"),
    ("gpu[000000-999999]", "names 1000000 hosts, more than the 100000"),  # a digit too many
    ("r[1-1000]n[1-1000]", "names 1000000 hosts"),  # a product: counted before any name is made
    ("a[1-60000],b[1-60000]", "names 120000 hosts"),  # the whole expression
    ("gpu001,g\u0440u002", "host name 'g\\u0440u002' is not ASCII"),  # a Cyrillic look-alike of 'p'
])
def test_bad_expressions_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(HostlistError, match=re.escape(message)):
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


def test_a_host_list_file_is_capped_and_ascii_too(tmp_path: Path) -> None:
    f = tmp_path / "hosts.txt"
    f.write_text("".join(f"r{r}n[1-{MAX_EXPANDED // 4}]\n" for r in range(5)))
    with pytest.raises(HostlistError, match=f"hosts.txt: names more than the {MAX_EXPANDED} hosts a host list may "
                                            "name \\(by line 5\\)"):
        read_hosts(str(f))
    f.write_text("gpu001\ng\u0440u001\n")
    with pytest.raises(HostlistError, match=r"hosts.txt, line 2: host name 'g\\u0440u001' is not ASCII"):
        read_hosts(str(f))
    assert expand(f"gpu[1-{MAX_EXPANDED}]")[-1] == f"gpu{MAX_EXPANDED}"  # the cap itself is a cluster


@pytest.mark.parametrize(("hosts", "said"), [
    ("gpu[000000-999999]", "clustergate merge: 'gpu[000000-999999]' names 1000000 hosts, more than the 100000 a host "
                           "expression may name (a digit too many?): give the cluster's hosts"),
    ("g\u0440u001", "clustergate merge: host name 'g\\u0440u001' is not ASCII ("),
])
def test_merge_refuses_a_host_expression_at_once(tmp_path: Path, hosts: str, said: str) -> None:
    """The command as a user types it: one line and exit 2, in a second, where a million names once took 300 s
    and 11 GB."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "clustergate", "merge", "-o", str(tmp_path / "out"), "--expect-hosts",
                        hosts], cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == Exit.USAGE, r.stderr
    assert r.stderr.startswith(said) and len(r.stderr.splitlines()) == 1, r.stderr
    assert time.monotonic() - t0 < 30 and not (tmp_path / "out" / "results.json").exists()
