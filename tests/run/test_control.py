"""Control exchanges say what they are for: a step's tag, its label, and what ranks at different steps read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clustergate.record.judge import Record, Where
from clustergate.record.outcomes import PhaseOutcome, PhaseVerdict
from clustergate.run.ranks.control import ControlMismatch, Step, decode, encode, within

ROOT = Path(__file__).resolve().parents[2]


def test_tag_is_the_test_and_phase_only() -> None:
    a = Step("t.py::test_a", "call", within(10), note="")
    assert a.tag == Step("t.py::test_a", "call", None, note="left: pytest.exit").tag
    assert a.tag != Step("t.py::test_a", "setup").tag != Step("t.py::test_b", "call").tag
    assert a.tag != Step(None, "session end").tag
    assert 0 <= a.tag < 2**63  # an int64 whose negation is one too


def test_labels_name_test_phase_and_why() -> None:
    assert str(Step("t.py::test_a", "call")) == "t.py::test_a [call]"
    assert str(Step(None, "session end", note="pytest.exit('x')")) == "session end (pytest.exit('x'))"


def test_ranks_at_different_steps_are_each_named() -> None:
    exc = ControlMismatch(Step("t.py::test_a", "call"), ["t.py::test_a [call]", "session end (left)",
                                                          "t.py::test_a [call]"])
    assert str(exc) == ("ranks are at different steps (a rank left the test or the run): ranks 0, 2 at "
                        "'t.py::test_a [call]'; rank 1 at 'session end (left)'")


# ---- what travels is JSON, checked; never pickle --------------------------------------------------------
PEER = '''
import os, pickle, sys
import torch, torch.distributed as dist
from clustergate.run.ranks import control
from clustergate.run.ranks.control import Step, within
from clustergate.record.outcomes import PhaseOutcome
from clustergate.run.ranks.world import World

rank, store, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
world = World(rank=rank, world_size=2, local_rank=rank, local_world_size=2, node_rank=0, host="h",
              device=torch.device("cpu"), backend="gloo", control=dist.group.WORLD)


class Planted:
    def __reduce__(self):  # unpickling this creates the marker file: proof that a pickle was loaded
        return (open, (marker, "w"))


def send_raw(step, raw):
    """Rank 1 speaks the wire format itself (header, then length-prefixed bytes), as a hostile peer would."""
    _, size = control._header(world, step, 0, len(raw))
    dist.all_gather([torch.zeros(size + 8, dtype=torch.uint8) for _ in range(2)], control._pack(raw, size))


for name, raw, check in (("pickle", pickle.dumps(Planted()), None),
                         ("shape", control.encode({"rank": 1, "outcome": "passed"}), PhaseOutcome.from_message)):
    step = Step(None, f"wire test {name}", within(30))
    if rank == 1:
        send_raw(step, raw)
    else:
        try:
            mine = PhaseOutcome(rank=0, host="h", outcome="passed", message="", stop=0.0).as_message()
            control.all_gather(world, mine, step, check=check)
            print(name, "ACCEPTED")
        except control.ControlMalformed as exc:
            print(name, "REFUSED", exc.rank, exc)
dist.barrier()
sys.stdout.flush()
os._exit(0)  # gloo's teardown at interpreter exit is not what this tests
'''


def test_a_pickle_from_a_peer_is_refused_naming_the_rank_and_never_loaded(tmp_path: Path) -> None:
    script, marker = tmp_path / "peer.py", tmp_path / "unpickled"
    script.write_text(PEER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "store"), str(marker)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    out = [p.communicate(timeout=120)[0] for p in procs]  # a hang guard: two small exchanges on gloo
    assert [p.returncode for p in procs] == [0, 0], out
    assert not marker.exists(), "rank 0 unpickled what rank 1 sent"
    lines = {line.split()[0]: line for line in out[0].splitlines() if line.startswith(("pickle ", "shape "))}
    assert lines["pickle"].startswith("pickle REFUSED 1 control exchange 'wire test pickle': rank 1 sent a malformed "
                                      "message (not JSON:"), out[0]
    assert "its first bytes are 80 04" in lines["pickle"] or "its first bytes are 80 05" in lines["pickle"]
    assert lines["shape"].startswith("shape REFUSED 1 control exchange 'wire test shape': rank 1 sent a malformed "
                                     "message (\"a phase outcome: missing ['"), out[0]


def test_a_value_json_cannot_carry_is_refused_where_it_is_sent() -> None:
    with pytest.raises(TypeError, match="a control message carries JSON only .* not set"):
        encode({"ranks": {1, 2}})
    assert decode(encode({"a": [1, 2.5, None, True, "x"]})) == {"a": [1, 2.5, None, True, "x"]}


def test_phase_messages_round_trip_and_shapes_are_checked() -> None:
    where = Where(rank=1, host="n1", node_rank=0, gpu_index=3, gpu_serial="S", gpu_uuid=None)
    outcome = PhaseOutcome(rank=1, host="n1", outcome="failed", message="E boom", stop=12.5,
                           records=[Record("m", 1.5, "GB/s", "gpu", "d", where)], details={"k": (1, 2)},
                           gpu_label="gpu 3", poisoned=True)
    back = PhaseOutcome.from_message(decode(encode(outcome.as_message())))
    assert back.records == outcome.records and back.details == {"k": [1, 2]} and back.poisoned
    verdict = PhaseVerdict(outcome="failed", message="x", failed_ranks=[1], problems=["p"])
    assert PhaseVerdict.from_message(decode(encode(verdict.as_message()))) == verdict
    with pytest.raises(TypeError, match="outcome.rank must be int, not str"):
        PhaseOutcome.from_message({**outcome.as_message(), "rank": "1"})
    with pytest.raises(KeyError, match="unexpected \\['extra'\\]"):
        PhaseVerdict.from_message({**verdict.as_message(), "extra": 1})
