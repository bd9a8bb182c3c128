"""Secrets never reach the report: redaction of names and values, and a run with planted secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_runs import HF_SECRET, SECRET, demo_reject  # noqa: F401

from clustergate.report.redact import REDACTED, Scrubber, is_secret_name, redact_mapping, shown_environment


@pytest.mark.parametrize("name", ["MY_API_TOKEN", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "DB_PASSWORD",
                                  "DB_PWD", "GITHUB_PAT", "SSH_KEY", "NCCL_AUTH_TOKEN", "private.key",
                                  "HTTP_AUTHORIZATION"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "PWD", "OLDPWD", "TOKENIZERS_PARALLELISM", "NCCL_IB_HCA", "KEYBOARD",
                                  "MONKEY", "CUDA_VISIBLE_DEVICES", "GIT_AUTHOR_NAME"])
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


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
