"""Endpoint faults cost one request, not a batch: a tiny OAT-GRPO run whose committee references and judge are a
local server (127.0.0.1) that fails 30% of requests with HTTP 500 and never answers 10% (held until the client's
timeout closes the connection). The run completes, every answer the server gave is used, and the counts in
metrics.jsonl equal the server's own log. The client's timeout grows with the machine's load (an answer the server
sends at once must not time out on a busy machine), and a hung request is a condition, not a sleep racing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.launch.cli import main
from tests.fault_server import FaultServer
from tests.test_oat_grpo import tiny_overrides
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[1]


def _client(name: str, url: str) -> str:
    timeout = scaled(1.5, cap=15.0)
    return (
        f"{{backend: openai, name: {name}, model: {name}, api: chat, endpoints: [{{url: '{url}'}}], "
        f"request_timeout_s: {timeout:.1f}, max_retries: 1, backoff_base_s: 0.01, backoff_max_s: 0.05, "
        f"deadline_s: {max(120.0, 20 * timeout):.0f}}}"
    )


def test_committee_faults_cost_one_request(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    server = FaultServer(fail=0.3, hang=0.1, seed=3, max_requests=1000, max_seconds=600)
    try:
        code = main(
            [
                "train",
                "oat-grpo",
                "--config",
                str(ROOT / "configs" / "oat_grpo_tiny.yaml"),
                *tiny_overrides(tiny_model_dir, tmp_path, "faults"),
                "loop.iterations=2",
                "loop.checkpoint_every=0",
                "eval_samples=0",
                f"committee.references=[{_client('ref', server.url)}]",
                f"committee.judge={_client('judge', server.url)}",
            ]
        )
    finally:
        server.close()
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "faults" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] >= 0]
    assert [r["step"] for r in steps] == [0, 1]

    def total(key: str) -> int:
        return sum(r.get(key, 0) for r in steps)

    ref, judge = server.counts("ref"), server.counts("judge")
    print(
        json.dumps(
            {
                "server_ref": ref,
                "server_judge": judge,
                "logged": {
                    k: total(k)
                    for k in (
                        "committee_requests",
                        "committee_failures",
                        "committee_http_answered",
                        "committee_http_failed",
                        "judge_requests",
                        "judge_failures",
                        "judge_http_answered",
                        "judge_http_failed",
                        "committee_fallbacks",
                        "committee_scored_groups",
                        "committee_groups",
                    )
                },
            }
        )
    )
    assert ref["failed_attempts"] > 0 and ref["unanswered"] > 0, ref  # the faults did happen
    # the logged counts are the server's own
    assert total("committee_requests") == ref["requests"]
    assert total("committee_failures") == ref["unanswered"]
    assert total("committee_http_answered") == ref["ok"]
    assert total("committee_http_failed") == ref["failed_attempts"]
    assert total("judge_requests") == judge["requests"]
    assert total("judge_failures") == judge["unanswered"]
    assert total("judge_http_answered") == judge["ok"] and total("judge_http_failed") == judge["failed_attempts"]
    # every good answer is used: one failed request never took the rest of its batch with it
    assert total("committee_requests") - total("committee_failures") == ref["answered"] > 0
    assert total("committee_scored_groups") > 0
    for record in steps:  # a mean over nothing is absent, never 0
        if record["committee_scored_groups"] == 0:
            assert "committee_score_mean" not in record
