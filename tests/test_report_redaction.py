"""Secrets never reach an output: redaction of names and values, and a run with planted secrets.

(The torchrun run that plants a token in every output is tests/test_run_endings.py.)"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from report_runs import HF_SECRET, SECRET, demo_reject  # noqa: F401

from clustergate.redact import REDACTED, Scrubber, is_secret_name, redact, redact_mapping, shown_environment
from clustergate.results import write_json

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["MY_API_TOKEN", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "DB_PASSWORD",
                                  "DB_PWD", "GITHUB_PAT", "SSH_KEY", "NCCL_IB_AUTH_TOKEN", "private.key",
                                  "HTTP_AUTHORIZATION", "AZURE_CREDENTIALS", "db_passwd",
                                  # Issue 12's rule is any name containing one of the words, in any case:
                                  # over-redacting a harmless variable costs nothing, a leak does.
                                  "TOKENIZERS_PARALLELISM", "KEYBOARD", "MONKEY", "GIT_AUTHOR_NAME"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "PWD", "OLDPWD", "NCCL_IB_HCA", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR"])
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


def test_structured_data_loses_secret_strings_but_keeps_figures() -> None:
    scrub = Scrubber.from_environment({"NCCL_IB_AUTH_TOKEN": "tok-0123456789"})
    data = {"details": {"nccl_env": {"NCCL_IB_AUTH_TOKEN": "tok-0123456789", "NCCL_DEBUG": "WARN"},
                        "tokens_per_s": 1234.5, "auth": {"user": "bob", "port": 22},
                        "log": ["sent tok-0123456789 to https://bob:hunter22@ci.example/"]}}
    assert redact(data, scrub) == {"details": {
        "nccl_env": {"NCCL_IB_AUTH_TOKEN": REDACTED, "NCCL_DEBUG": "WARN"},
        "tokens_per_s": 1234.5, "auth": {"user": REDACTED, "port": 22},
        "log": [f"sent {REDACTED} to https://{REDACTED}@ci.example/"]}}


def test_results_json_is_strict_and_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_planted_secret_value")
    write_json(tmp_path / "results.json", {"message": "login hf_planted_secret_value", "value": 1.5})
    assert json.loads((tmp_path / "results.json").read_text()) == {"message": f"login {REDACTED}", "value": 1.5}
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        write_json(tmp_path / "results.json", {"value": float("inf")})
    assert json.loads((tmp_path / "results.json").read_text())["value"] == 1.5  # the earlier file stands


def test_mappings_and_text_are_redacted() -> None:
    data = {"Python": "3.11", "CI": {"JENKINS_URL": "https://bob:hunter22@ci.example/", "API_TOKEN": "abc"}}
    out = redact_mapping(data)
    assert out == {"Python": "3.11", "CI": {"JENKINS_URL": f"https://{REDACTED}@ci.example/", "API_TOKEN": REDACTED}}
    env = {"NCCL_DEBUG": "INFO", "HF_TOKEN": "hf_x", "HOME": "/root", "MY_API_TOKEN": "zzz"}
    assert shown_environment(env) == {"HF_TOKEN": REDACTED, "NCCL_DEBUG": "INFO"}
    scrub = Scrubber.from_environment({"MY_API_TOKEN": "tok-123456", "TOKENIZERS_PARALLELISM": "false",
                                       "SHORT_KEY": "abc"}, extra={"meta": {"password": "pa55word!"}})
    assert scrub("token tok-123456 and pa55word! but false and abc stay") == \
        f"token {REDACTED} and {REDACTED} but false and abc stay"


@pytest.mark.slow  # a torchrun job (shared by the report tests)
def test_planted_secrets_are_absent_from_the_report(demo_reject: Path) -> None:  # noqa: F811
    page = (demo_reject / "report" / "report.html").read_text()
    output = (demo_reject / "output.txt").read_text()
    assert "workload log: connecting with token" in output  # the workload did print it (pytest shows it)
    assert SECRET not in page and HF_SECRET not in page
    assert "connecting with token [redacted]" in page  # the captured log was scrubbed, not dropped
    assert "HF_TOKEN&#34;: &#34;[redacted]&#34;" in page  # the environment table names it, without its value
    assert "MY_API_TOKEN&#34;: &#34;[redacted]&#34;" in page  # --metadata MY_API_TOKEN ... redacted too


def test_a_throughput_figure_named_tokens_per_s_keeps_its_text() -> None:
    """``lora_tokens_per_s_per_gpu`` is a rate, not a token: tables keyed by metric name stay readable."""
    scrub = Scrubber.from_environment({})
    data = {"lora_tokens_per_s_per_gpu": {"unit": "tokens/s", "severity": "fail"}, "HF_TOKEN": "hf_x",
            "tokens": "abc"}
    assert redact(data, scrub) == {"lora_tokens_per_s_per_gpu": {"unit": "tokens/s", "severity": "fail"},
                                   "HF_TOKEN": REDACTED, "tokens": REDACTED}


NUMERIC_FIELDS = {"token_read_by_ranks", "token_visible_after_s", "tokens", "flops_per_token"}
"""Fields of the suite's own records whose names look secret but whose values are numbers: redaction
replaces string values only, so these pass through whole."""


def test_the_suite_names_no_text_field_of_its_own_records_like_a_secret() -> None:
    # Redaction hides every string under a secret-looking name, the suite's own fields too: the expected-
    # configuration table once called its setting "key" and every results.json said "[redacted]" there.
    found = set()
    for package in ("acceptance", "workloads", "clustergate"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Dict):
                    found |= {f"{path.relative_to(ROOT)}: {k.value}" for k in node.keys if isinstance(k, ast.Constant)
                              and isinstance(k.value, str) and is_secret_name(k.value)
                              and k.value not in NUMERIC_FIELDS}
    assert not found, f"rename these fields (redaction would hide their text): {sorted(found)}"
