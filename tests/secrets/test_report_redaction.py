"""Secrets never reach an output: redaction of names and values, and a run with planted secrets.

(The torchrun run that plants a token in every output is tests/run/test_run_endings.py.)"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from forked_pytest import pytest_forked
from report_runs import HF_SECRET, SECRET, demo_reject  # noqa: F401

from clustergate.record.results import write_json
from clustergate.secrets.redact import (
    PART,
    REDACTED,
    Scrubber,
    is_secret_name,
    redact,
    redact_mapping,
    shown_environment,
)

from torchrun_job import job_env, run_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["MY_API_TOKEN", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "DB_PASSWORD",
                                  "DB_PWD", "GITHUB_PAT", "SSH_KEY", "NCCL_IB_AUTH_TOKEN", "private.key",
                                  "HTTP_AUTHORIZATION", "AZURE_CREDENTIALS", "db_passwd",
                                  # The rule is any name containing one of the words, in any case:
                                  # over-redacting a harmless variable costs nothing, a leak does.
                                  "TOKENIZERS_PARALLELISM", "KEYBOARD", "MONKEY", "GIT_AUTHOR_NAME",
                                  # and the shorter spellings: *PASS, *PW, *CREDS, *DSN, *CONNECTION_STRING, *WEBHOOK*
                                  "DB_PASS", "SMTP_PW", "MYSQLPW", "AZURE_CREDS", "GCP_CREDS_JSON", "SENTRY_DSN",
                                  "DB_CONNECTION_STRING", "AZURE_STORAGE_CONNECTION_STRING", "SLACK_WEBHOOK_URL",
                                  "WEBHOOK", "teams_webhook_path"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "PWD", "OLDPWD", "NCCL_IB_HCA", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR",
                                  "XDG_SESSION_ID", "HOSTNAME", "NCCL_SOCKET_IFNAME", "errors_by_pass", "PASS",
                                  "NCCL_IB_PKEY", "UCX_IB_PKEY"])
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
    assert scrub("token tok-123456 and pa55word! but false stays, abc goes and abcd stays") == \
        f"token {REDACTED} and {REDACTED} but false stays, {REDACTED} goes and abcd stays"


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


# ---- names, URLs, values of any length, cut values, other ranks' secrets ---------------------------------

def test_a_site_names_its_own_secret_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"CLUSTERGATE_REDACT_VARS": "DB_URL, MYCO_*", "DB_URL": "mysql-host-one", "MYCO_LICENSE": "lic-9f8e7d",
           "NCCL_DEBUG": "INFO"}
    assert is_secret_name("DB_URL", env) and is_secret_name("MYCO_LICENSE", env)
    assert not is_secret_name("NCCL_DEBUG", env)
    scrub = Scrubber.from_environment(env)
    assert scrub("db mysql-host-one, license lic-9f8e7d, INFO") == f"db {REDACTED}, license {REDACTED}, INFO"
    monkeypatch.setenv("CLUSTERGATE_REDACT_VARS", "DB_URL")
    assert redact({"DB_URL": "x", "other": "y"}, Scrubber([])) == {"DB_URL": REDACTED, "other": "y"}


def test_the_live_scrubber_follows_the_secrets_of_the_environment_not_every_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest sets PYTEST_CURRENT_TEST at every phase of every test: the live scrubber (and what it remembers) is
    kept while the secrets stay the same, and follows a secret set, a site's list or a value that holds a token."""
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "acceptance/test_a.py::test_one (setup)")
    before = Scrubber.from_environment()
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "acceptance/test_a.py::test_two (call)")
    assert Scrubber.from_environment() is before
    monkeypatch.setenv("SOME_API_TOKEN", "tok-live-0123456")
    assert Scrubber.from_environment()("saw tok-live-0123456") == f"saw {REDACTED}"
    monkeypatch.setenv("MYCO_LICENSE", "lic-live-9f8e7d")
    monkeypatch.setenv("CLUSTERGATE_REDACT_VARS", "MYCO_*")
    assert Scrubber.from_environment()("lic-live-9f8e7d") == REDACTED
    monkeypatch.setenv("NCCL_PLANTED", "auth=x password=hunter2live")
    assert Scrubber.from_environment()("hunter2live") == REDACTED
    monkeypatch.delenv("SOME_API_TOKEN")
    assert Scrubber.from_environment()("saw tok-live-0123456") == "saw tok-live-0123456"


@pytest.mark.parametrize(("text", "expected"), [
    ("https://ghp_tok3n@github.com/org/repo.git", "https://[redacted]@github.com/org/repo.git"),
    ("http://:hunter22@db.example:5432/x", "http://[redacted]@db.example:5432/x"),
    ("https://bob:p@ss/w@rd@ci.example/job", "https://[redacted]@ci.example/job"),
    ("redis://default:s3cr3t@cache:6379", "redis://[redacted]@cache:6379"),
    ("see https://registry.example/@scope/pkg", "see https://registry.example/@scope/pkg"),  # no userinfo
    ("mail bob@example.org", "mail bob@example.org"),
])
def test_every_userinfo_of_a_url_is_redacted(text: str, expected: str) -> None:
    assert Scrubber([])(text) == expected
    assert json.loads(Scrubber([])(json.dumps({"url": text, "next": "a@b"}))) == {"url": expected, "next": "a@b"}


@pytest.mark.parametrize(("text", "expected"), [
    ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9v+YmFy/cXV4==;EndpointSuffix=core.windows.net",
     "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=[redacted];EndpointSuffix=core.windows.net"),
    ("Endpoint=sb://ns.example/;SharedAccessKeyName=root;SharedAccessKey=a1b2c3",
     "Endpoint=sb://ns.example/;SharedAccessKeyName=[redacted];SharedAccessKey=[redacted]"),
    ("https://acct.blob.example/c?sv=2022-11-02&sig=AbC%2Bd&se=2026", "https://acct.blob.example/c?sv=2022-11-02&sig=[redacted]&se=2026"),
    ("Server=db;User Id=sa;Password='pa55';", "Server=db;User Id=sa;Password='[redacted]';"),
    ("tokens_per_s=123 level=quick", "tokens_per_s=123 level=quick"),
])
def test_secret_pairs_inside_values_are_redacted(text: str, expected: str) -> None:
    assert Scrubber([])(text) == expected


def test_values_of_any_length_digits_only_included() -> None:
    """Short and digits-only values go wherever they stand alone; inside a longer word or number they stay
    (a PIN must not eat a year or a size), and a one-character value or a flag is no secret."""
    env = {"DB_PASS": "pw", "MY_PIN_SECRET": "4711", "ACCOUNT_KEY": "123456789012", "API_TOKEN": "zq9!",
           "FLAG_TOKEN": "1", "OTHER_KEY": "x"}
    scrub = Scrubber.from_environment(env)
    said = scrub("login pw; pin 4711, account 123456789012 and zq9! but 47110, 2026.4711, pwd, x and 1 stay")
    assert said == (f"login {REDACTED}; pin {REDACTED}, account {REDACTED} and {REDACTED} but 47110, 2026.4711, "
                    "pwd, x and 1 stay")
    assert redact({"MY_PIN_SECRET": "4711", "x": "4711 ok"}, scrub) == {"MY_PIN_SECRET": REDACTED,
                                                                       "x": f"{REDACTED} ok"}


def test_the_heads_and_tails_pytest_leaves_of_a_long_secret_are_redacted() -> None:
    secret = "AKIAIOSFODNN7EXAMPLE-wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    scrub = Scrubber.from_environment({"AWS_SECRET_ACCESS_KEY": secret})
    cut = f"assert '{secret[:13]}...{secret[-13:]}' == 'x'\n{secret[:40]}...\n...{secret[-9:]}"
    said = scrub(cut)
    assert secret[:PART] not in said and secret[-PART:] not in said, said
    assert said == f"assert '{REDACTED}...{REDACTED}' == 'x'\n{REDACTED}...\n...{REDACTED}"
    # Not cut by an ellipsis: a text that merely shares a head is kept.
    assert scrub(f"{secret[:10]}X and more") == f"{secret[:10]}X and more"


LONG_SECRET = "lng-7Hq2Vd9Kx4Rb8Zp1Wm6Ty3Nc5Lf0Gs2Jh8Ue4Oa9Xi1Qw7Er5Ty3"
SHORT_SECRET = "q7!x"


def test_a_failing_assert_on_a_long_secret_leaves_no_part_of_it(tmp_path: Path) -> None:
    """A real run: pytest shortens the secret in its assertion text ('lng-7Hq2Vd9...Ty3'); no output keeps any
    8 characters of it, and the short password the test prints is gone too."""
    (tmp_path / "test_cut.py").write_text(
        "import os\n\n"
        "def test_cut():\n"
        "    print('login', os.environ['DB_PASS'], 'with', os.environ['MY_API_TOKEN'])\n"
        "    assert os.environ['MY_API_TOKEN'] == 'the-expected-token'\n")
    report = tmp_path / "report"
    own = tmp_path / "run"
    own.mkdir()
    run = pytest_forked(tmp_path, job_env({"MY_API_TOKEN": LONG_SECRET, "DB_PASS": SHORT_SECRET}),
                        ["-p", "clustergate", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "--report-dir",
                         str(report), "test_cut.py", "-rA"], own)
    outputs = {name: (report / name).read_text() for name in
               ("results.json", "junit.xml", "progress.jsonl", "report.html")}
    outputs["terminal"] = "\n".join([*run.outlines, *run.errlines])
    assert "AssertionError" in outputs["terminal"] and "...[redacted]" in outputs["terminal"], \
        outputs["terminal"][-3000:]
    parts = {LONG_SECRET[i:i + PART] for i in range(len(LONG_SECRET) - PART + 1)}
    for name, text in outputs.items():
        assert not [p for p in parts if p in text], (name, [p for p in parts if p in text])
        assert SHORT_SECRET not in text, name
    assert f"login {REDACTED} with {REDACTED}" in outputs["report.html"]


OTHER_NODE_SECRET = "node1-only-9Vx3Kq7Lm2Zp8Rt4Wb6Yc1Nd5Hf0Gj"

OTHER_NODE_TEST = '''
import os

TOKEN = os.environ.get("MY_API_TOKEN", "")


def test_a_secret_set_on_one_node(cg):
    print(f"workload log: connecting with {TOKEN} to https://{TOKEN}@store.example/")
    cg.details["seen"] = cg.all_ranks(f"rank {cg.rank} uses {TOKEN}")
    if TOKEN:
        assert TOKEN == "the-expected-token", f"login refused for {TOKEN}"
'''


@pytest.mark.slow  # two torchrun agents
def test_a_secret_set_only_on_another_node_reaches_no_output(tmp_path: Path) -> None:
    """Rank 0 cannot know rank 1's environment: rank 1 scrubs what it sends (its failure, a gathered value)."""
    (tmp_path / "test_other_node.py").write_text(OTHER_NODE_TEST)
    r = run_job(tmp_path, ["--thresholds", str(ROOT / "thresholds.yaml"), "test_other_node.py"], nodes=2, nproc=1,
                timeout=240, node_env=[{}, {"MY_API_TOKEN": OTHER_NODE_SECRET}])
    test = r.results["tests"][0]
    assert test["outcome"] == "failed" and test["failed_ranks"] == [1], r.output[-3000:]
    assert f"login refused for {REDACTED}" in test["message"]
    assert test["details"]["seen"] == ["rank 0 uses ", f"rank 1 uses {REDACTED}"]
    parts = {OTHER_NODE_SECRET[i:i + PART] for i in range(len(OTHER_NODE_SECRET) - PART + 1)}
    written = {p.name: p.read_text(errors="replace") for p in r.report_dir.rglob("*") if p.is_file()}
    assert {"results.json", "report.html", "junit.xml", "progress.jsonl"} <= set(written)
    for name, text in {**written, "terminal": r.output}.items():
        assert not [p for p in parts if p in text], name


def test_a_short_numeric_secret_never_breaks_what_a_report_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 12's number stays a number: scrubbing the JSON text of a report's properties turned it into
    ``[redacted]``, which is no JSON (the makereport hook then crashed)."""
    from clustergate.run.items import scrub_report

    monkeypatch.setenv("MY_PIN_SECRET", "12")
    report = pytest.TestReport("t.py::x", ("t.py", 0, "x"), {}, "failed", "rank 12 saw pin 12", "call",
                               user_properties=[("failed_ranks", [12]),
                                                ("metrics", [{"per_rank": [{"rank": 12, "host": "pin 12"}]}])])
    scrub_report(report)
    assert report.user_properties == [("failed_ranks", [12]),
                                      ("metrics", [{"per_rank": [{"rank": 12, "host": f"pin {REDACTED}"}]}])]
    assert report.longrepr == f"rank {REDACTED} saw pin {REDACTED}"


# ---- secrets inside values, over several lines, escaped; names the run chose stay whole ----------------------

PEM = ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7pl4nTed\n"
       "Qx9Lk2Vb7Rt3Zm8Ws1Np6Yc4Hd0Jf5Ue2Oa7Ki9Xg3Tq8Lr1\n9Vx3Kq7Lm2Zp8Rt4Wb6==\n-----END PRIVATE KEY-----")
ESCAPED = "ab\\cd\tef-7391"
"""A password with a backslash and a tab: pytest's repr shows it as 'ab\\\\cd\\tef-7391'."""
BEARER = "tok_9Zq4Wm7Xp2Lr8Vt"
META_PASSWORD = "hunter22x-meta"

SECRETS_TEST = '''
import os


def test_secrets_in_outputs():
    print("curl said", os.environ["BEARER_SEEN"], "and pin", os.environ["BMC_PASSWORD"])
    assert os.environ["TLS_KEY"] == "not the key\\nat all\\nthree lines"


def test_escaped():
    assert os.environ["DB_PASSWORD"] == "something else"
'''


def test_values_that_hold_secrets_are_scrubbed_wherever_the_secret_appears() -> None:
    env = {"CURL_OPTS": f"-H 'Authorization: Bearer {BEARER}'", "NOTE": "password: pa55-note-9",
           "CONN": "host=db token=zzq-77-token"}
    scrub = Scrubber.from_environment(env, extra={"deploy": f"see password: {META_PASSWORD}"})
    said = scrub(f"got {BEARER}, pa55-note-9, zzq-77-token and {META_PASSWORD}")
    assert said == f"got {REDACTED}, {REDACTED}, {REDACTED} and {REDACTED}"
    assert scrub("Authorization: Basic dXNlcjpwYXNz; X-Api-Key: k3y-value; password: 'pw-1'") == \
        f"Authorization: Basic {REDACTED}; X-Api-Key: {REDACTED}; password: '{REDACTED}'"
    # A colon after a message or a count is no secret: KeyError, tokens.
    assert scrub("KeyError: 'x' after tokens: 4096") == "KeyError: 'x' after tokens: 4096"


def test_every_line_of_a_secret_of_several_lines_and_its_escaped_forms() -> None:
    scrub = Scrubber.from_environment({"TLS_KEY": PEM, "DB_PASSWORD": ESCAPED})
    diff = "\n".join(f"E   - {line}" for line in PEM.splitlines()[1:3])
    assert PEM.splitlines()[1] not in scrub(diff) and PEM.splitlines()[2] not in scrub(diff)
    assert scrub(repr(ESCAPED)) == f"'{REDACTED}'" and scrub(json.dumps(ESCAPED)) == f'"{REDACTED}"'
    assert scrub("== x") == "== x"  # the PEM's lines of punctuation are no secret


@pytest.mark.slow  # a torchrun job
def test_a_run_scrubs_values_diffs_and_escapes_but_never_its_report_directory(tmp_path: Path) -> None:
    """BMC_PASSWORD=2026 and a report directory named for 2026: the outputs land there, named as given, while
    2026 standing alone is scrubbed; the PEM key's lines in pytest's diff, the escaped password and a bearer
    token found inside another variable's value reach no output."""
    (tmp_path / "test_secrets.py").write_text(SECRETS_TEST)
    report = tmp_path / "reports" / "run-2026"
    env = {"BMC_PASSWORD": "2026", "TLS_KEY": PEM, "DB_PASSWORD": ESCAPED, "BEARER_SEEN": BEARER,
           "CURL_OPTS": f"-H 'Authorization: Bearer {BEARER}'"}
    r = run_job(tmp_path, ["--thresholds", str(ROOT / "thresholds.yaml"), "test_secrets.py", "-vv",
                           "--metadata", "deploy_note", f"password: {META_PASSWORD}"], report_dir=report, env=env)
    assert r.codes == [1], r.output[-3000:]
    assert not (tmp_path / "reports" / REDACTED).exists() and not any("redacted" in p.name for p in
                                                                       (tmp_path / "reports").iterdir())
    written = {p.name: p.read_text(errors="replace") for p in report.iterdir() if p.is_file()}
    assert {"results.json", "report.html", "junit.xml", "progress.jsonl"} <= set(written), sorted(written)
    assert f"report directory {report}" in r.output and f"results: {report / 'results.json'}" in r.output
    results = json.loads(written["results.json"])
    assert f"and pin {REDACTED}" in results["tests"][0]["message"] or f"and pin {REDACTED}" in written["report.html"]
    secrets = [BEARER, META_PASSWORD, ESCAPED, repr(ESCAPED)[1:-1], *PEM.splitlines()[1:4]]
    for name, text in {**written, "terminal": r.output}.items():
        assert not [s for s in secrets if s in text], (name, [s for s in secrets if s in text])
