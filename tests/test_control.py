"""Control exchanges say what they are for: a step's tag, its label, and what ranks at different steps read."""

from __future__ import annotations

from clustergate.control import ControlMismatch, Step, within


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
