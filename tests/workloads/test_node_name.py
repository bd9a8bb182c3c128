"""The name a node goes by: given, else Slurm's, else the host name."""

from __future__ import annotations

import socket

import pytest

from workloads.node.name import NodeNameError, node_name, problem


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


@pytest.mark.parametrize(("name", "why"), [
    ("gpu-017\nACCEPTED", "'\\n'"), ("gpu 17", "' '"), ("gpu\t17", "'\\t'"), ("../etc", "path separator"),
    ("a/b", "path separator"), ("..", "path step"), ("gpu\u200b17", "invisible"), ("x" * 254, "at most 253"),
    ("-rf", "starts with '-'"), ("g\u0440u001", "not ASCII"),
])
def test_a_name_that_is_not_an_identity_is_refused_naming_its_source(monkeypatch: pytest.MonkeyPatch, name: str,
                                                                      why: str) -> None:
    monkeypatch.setenv("CLUSTERGATE_NODE_NAME", name)
    with pytest.raises(NodeNameError) as caught:
        node_name()
    text = str(caught.value)
    assert "$CLUSTERGATE_NODE_NAME" in text and "set CLUSTERGATE_NODE_NAME" in text
    assert why in text or why.strip("'") in repr(text), text


def test_a_look_alike_name_is_named_with_its_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """gрu001 (a Cyrillic р) reads as gpu001 on every page: the refusal shows which letter is not what it seems."""
    monkeypatch.setenv("CLUSTERGATE_NODE_NAME", "g\u0440u001")
    with pytest.raises(NodeNameError) as caught:
        node_name()
    said = str(caught.value)
    assert said.startswith("node name 'g\\u0440u001' from $CLUSTERGATE_NODE_NAME: it is not ASCII ("), said
    assert str(caught.value).isascii()
    assert problem("g\u0440u001") is not None and problem("gpu001") is None


@pytest.mark.parametrize("name", ["gpu-017", "node3.cluster.local", "dgx_a_01", "h100-0001"])
def test_ordinary_names_pass(name: str) -> None:
    assert problem(name) is None
