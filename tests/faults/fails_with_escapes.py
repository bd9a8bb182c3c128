import os
import sys

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m"
"""A retitle, a clear screen and a colour: what a failing workload's message or output could carry."""


def test_fails_with_escapes_in_its_message() -> None:
    print(f"captured output{ESCAPES} of rank {os.environ.get('RANK', '0')}")
    sys.stderr.write(f"captured error{ESCAPES}\n")
    assert os.environ.get("RANK", "0") != "0", f"planted failure{ESCAPES} on rank 0"
