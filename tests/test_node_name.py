"""The name a node goes by: given, else Slurm's, else the host name."""

from __future__ import annotations

import socket

import pytest

from workloads.node.name import node_name


def test_host_name_when_nothing_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLUSTERGATE_NODE_NAME", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert node_name() == socket.gethostname()


def test_slurm_node_name_tells_nodes_on_one_host_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLUSTERGATE_NODE_NAME", raising=False)
    monkeypatch.setenv("SLURMD_NODENAME", "node3")
    assert node_name() == "node3"


def test_a_given_name_wins_and_blank_values_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "node3")
    monkeypatch.setenv("CLUSTERGATE_NODE_NAME", "gpu-017")
    assert node_name() == "gpu-017"
    monkeypatch.setenv("CLUSTERGATE_NODE_NAME", "  ")
    assert node_name() == "node3"
