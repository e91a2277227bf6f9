"""Expert-trace distillation: rejection sampling, per-role chat rows, resumable writing, stats and Arrow copies."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest

import memrl.data.distill as distill
import memrl.rollout.expert_traces as expert_traces
from memrl.data.config import RunConfig, load_config
from memrl.data.distill import DistillWriter, RejectionConfig, distill_traces, load_sft_examples, role_file, trace_rows
from memrl.data.experts.sam import SamOracleConfig
from memrl.data.formats import (
    render_intervention,
    render_phase1_prompt,
    render_phase2_prompt,
    render_sam_consolidate_prompt,
    render_sam_recall_prompt,
    render_tool_call,
)
from memrl.data.io import RecordError, iter_jsonl
from memrl.data.schemas import EpisodeTrace, MemoryCall, Message, SFTExample
from memrl.data.tasks import TaskSetConfig, load_tasks
from memrl.data.tasks.common import content_of, role_of
from memrl.data.tasks.sam import SamReasoner, SamTaskParams
from memrl.rollout.agents import sam_rollout
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.expert_traces import DistillRunConfig, run_distill
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.memory.sam import SamConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

COLORS = ["red", "blue", "green", "brass", "silver", "golden"]
ITEMS = ["key", "gem", "coin", "book", "lamp"]
PLACES = ["drawer", "chest", "box", "shelf"]


def _call(call_id: str, role: str, step: int, prompt: list[dict[str, str]], text: str) -> MemoryCall:
    """A memory call of the expert at ``step``: its rendered prompt and what it answered."""
    return MemoryCall(call_id=call_id, role=role, step=step, messages=[Message(**m) for m in prompt], text=text)


def expert_trace(i: int, error_rate: float, rng: random.Random) -> tuple[EpisodeTrace, bool]:
    """A SAM + proactive trace of a noisy expert: with probability ``error_rate`` its recall names a wrong place and
    the reasoner's answer is wrong (outcome 0). Returns the trace and whether the expert was right."""
    item = f"{rng.choice(COLORS)} {rng.choice(ITEMS)}"
    place = f"{rng.choice(PLACES)} {rng.randint(1, 9)}"
    pages = [f"t{3 * p}> look around\nthe {rng.choice(COLORS)} lamp is in shelf {p}" for p in range(3)]
    needle = rng.randrange(3)
    pages[needle] = f"t{3 * needle}> open {place}\nthe {item} is in {place}"
    calls = [
        _call(
            f"c{p}",
            "consolidate",
            p,
            render_sam_consolidate_prompt(p, page),
            page.split("\n")[1].removeprefix("the ").replace(" is in ", ", "),
        )
        for p, page in enumerate(pages)
    ]
    right = rng.random() >= error_rate
    said = place if right else f"{place.split()[0]} {int(place.split()[1]) % 9 + 1}"
    recall_prompt = render_sam_recall_prompt(f"where is the {item}?", needle, pages[needle], "")
    calls.append(_call("r0", "recall", 3, recall_prompt, f"the {item} is in {said}"))
    bank = "status: none\nknowledge: none\nprocedural: none"
    window = f"[step 1] action: cat notes\nremember to use {place}"
    save = render_tool_call("memory_save_knowledge", {"content": f"use {place}"})
    calls.append(_call("b0", "bank_edit", 4, render_phase1_prompt("tidy up", window, bank), save))
    reminder = render_intervention(f"use {place}" if i % 2 else None)
    calls.append(_call("i0", "intervene", 4, render_phase2_prompt("tidy up", window, bank), reminder))
    trace = EpisodeTrace(
        trace_id=f"trace-{i:04d}",
        task_id=f"task-{i:04d}",
        memory_system="sam",
        answer=said,
        outcome=1.0 if said == place else 0.0,
        memory_calls=calls,
        metadata={"gold": place},
    )
    return trace, right


def make_traces(n: int, error_rate: float, seed: int = 0) -> list[tuple[EpisodeTrace, bool]]:
    rng = random.Random(seed)
    return [expert_trace(i, error_rate, rng) for i in range(n)]


def read_rows(out: Path) -> dict[str, list[SFTExample]]:
    return {p.stem: load_sft_examples(p) for p in sorted(out.glob("*.jsonl")) if p.name != distill.PROGRESS_FILE}


def test_rejection_keeps_only_correct_traces(tmp_path: Path) -> None:
    pairs = make_traces(200, error_rate=0.3)
    right = {t.trace_id for t, ok in pairs if ok}
    stats = distill_traces([t for t, _ in pairs], tmp_path, progress=False)
    rows = read_rows(tmp_path)
    assert set(rows) == {"consolidate", "recall", "bank_edit", "intervene"}
    kept_traces = {r.trace_id for role_rows in rows.values() for r in role_rows}
    assert kept_traces == right  # every correct trace is kept, and nothing else
    for r in rows["recall"]:  # the kept recall targets are true: the line is on the page the expert read
        assert r.metadata["outcome"] == 1.0 and r.messages[-1].content in r.messages[-2].content
    assert 110 <= len(right) <= 170  # 30% of 200 wrong, binomially
    assert stats["traces"] == {
        "total": 200,
        "kept": len(right),
        "rejected": 200 - len(right),
        "keep_rate": round(len(right) / 200, 4),
    }
    assert stats["roles"]["consolidate"]["kept"] == 3 * len(right)
    assert stats["roles"]["consolidate"]["rejected"] == 3 * (200 - len(right))
    for role in ("recall", "bank_edit", "intervene"):
        assert stats["roles"][role]["kept"] == len(rows[role]) == len(right)
        assert stats["roles"][role]["rejected"] == 200 - len(right)
    assert stats["rows"]["kept"] == 6 * len(right)
    assert json.loads((tmp_path / distill.STATS_FILE).read_text()) == stats


def test_rows_are_the_exact_messages_plus_the_expert_output(tmp_path: Path) -> None:
    trace, _ = make_traces(1, error_rate=0.0)[0]
    rows, skipped = trace_rows(trace)
    assert not skipped
    assert [r.role for r in rows] == ["consolidate"] * 3 + ["recall", "bank_edit", "intervene"]
    for row, call in zip(rows, trace.memory_calls, strict=True):
        assert row.messages[:-1] == call.messages
        assert row.messages[-1] == Message(role="assistant", content=call.text)
        assert row.trace_id == trace.trace_id and row.task_id == trace.task_id
        assert row.metadata["call_id"] == call.call_id
    assert len({r.row_id for r in rows}) == len(rows)


def test_arrow_copies_round_trip(tmp_path: Path) -> None:
    distill_traces([t for t, _ in make_traces(12, 0.3, seed=3)], tmp_path, progress=False)
    for role, rows in read_rows(tmp_path).items():
        assert load_sft_examples(role_file(tmp_path, role, ".arrow")) == rows


def test_keep_rule_options_and_skipped_calls(tmp_path: Path) -> None:
    pairs = make_traces(20, 0.5, seed=1)
    traces = [t for t, _ in pairs]
    broken = traces[0].model_copy(deep=True)
    broken.outcome = 1.0
    broken.memory_calls[0].error = "engine timeout"
    broken.memory_calls[1].finish_reason = "length"
    traces[0] = broken
    stats = distill_traces(
        traces, tmp_path / "a", RejectionConfig(min_outcome=0.0, roles=["consolidate", "recall"]), progress=False
    )
    assert stats["traces"]["kept"] == 20
    assert set(stats["roles"]) == {"consolidate", "recall"}
    assert stats["roles"]["consolidate"]["skipped"] == 2 and stats["rows"]["skipped"] == 2
    assert stats["roles"]["consolidate"]["kept"] == 3 * 20 - 2

    even = distill_traces(traces, tmp_path / "b", keep=lambda t: int(t.trace_id[-1]) % 2 == 0, progress=False)
    assert even["traces"]["kept"] == 10 and even["keep_rule"] == "custom predicate"

    cfg = RejectionConfig(predicate="tests.test_distill:keep_odd")
    assert cfg.keep_rule()(traces[1]) and not cfg.keep_rule()(traces[2])
    with pytest.raises(Exception, match="cannot be imported"):
        RejectionConfig(predicate="tests.test_distill:nope").keep_rule()

    unscored = traces[1].model_copy(update={"outcome": None})
    assert not RejectionConfig(min_outcome=0.0).keep_rule()(unscored)


def keep_odd(trace: EpisodeTrace) -> bool:
    return int(trace.trace_id[-1]) % 2 == 1


def test_bad_role_names_are_refused_before_writing(tmp_path: Path) -> None:
    trace, _ = make_traces(1, 0.0)[0]
    trace.memory_calls[0].role = "../escape"
    writer = DistillWriter(tmp_path)
    with pytest.raises(ValueError, match="cannot name a dataset file"):
        writer.add(trace)
    assert not list(tmp_path.glob("*.jsonl"))
    with pytest.raises(ValueError):
        role_file(tmp_path, "progress")


class Killed(Exception):
    pass


@pytest.mark.parametrize("kill_at", [1, 5, 7, 23, 40])
def test_resume_after_a_kill_gives_exactly_the_uninterrupted_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill_at: int
) -> None:
    traces = [t for t, _ in make_traces(10, 0.3, seed=7)]
    full = tmp_path / "full"
    distill_traces(traces, full, progress=False)

    # The kill lands inside the kill_at-th append (a row or a progress line): half of its bytes reach the disk.
    real_append = distill.append_jsonl
    calls = {"n": 0}

    def dying_append(path, record):
        calls["n"] += 1
        if calls["n"] == kill_at:
            line = record.model_dump_json() if hasattr(record, "model_dump_json") else json.dumps(record)
            with open(path, "ab") as fh:
                fh.write(line.encode()[: len(line) // 2])
            raise Killed
        real_append(path, record)

    part = tmp_path / "part"
    monkeypatch.setattr(distill, "append_jsonl", dying_append)
    writer = DistillWriter(part)
    with pytest.raises(Killed):
        for trace in traces:
            writer.add(trace)
    monkeypatch.setattr(distill, "append_jsonl", real_append)
    torn = [p for p in part.glob("*.jsonl") if not p.read_bytes().endswith(b"\n")]
    assert torn  # the interruption left a torn last line behind

    resumed = DistillWriter(part)
    assert resumed.resumed == len(resumed.finished) < len(traces)
    for trace in traces:
        resumed.add(trace)
    stats = resumed.finish(echo=False)
    assert stats == json.loads((full / distill.STATS_FILE).read_text())
    for name in sorted(p.name for p in full.glob("*.jsonl")):
        if name == distill.PROGRESS_FILE:
            continue
        assert (part / name).read_bytes() == (full / name).read_bytes(), name
    assert not resumed.add(traces[0])  # already done: nothing is written twice


def test_malformed_rows_are_rejected_with_their_location(tmp_path: Path) -> None:
    path = tmp_path / "recall.jsonl"
    path.write_text(
        json.dumps(
            {
                "row_id": "a",
                "role": "recall",
                "messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}],
            }
        )
        + "\n"
    )
    with pytest.raises(RecordError, match=r"recall.jsonl:1: field 'messages'"):
        load_sft_examples(path)


# ---------------------------------------------------------------------------------------------------- the real runner
def noisy_sam_distill(root: Path, name: str, **run: Any) -> DistillRunConfig:
    """40 short SAM tasks, the SAM oracle wrong 30% of the time (a wrong place in a recall, a dropped cue entity)."""
    return DistillRunConfig(
        run=RunConfig(output_dir=str(root), name=name, seed=0, **run),
        tasks=TaskSetConfig(
            count=40, seed=0, sam=SamTaskParams(horizon_steps=8, facts_per_obs=1, containers_per_room=2)
        ),
        sam_oracle=SamOracleConfig(error_rate=0.3),
        sam_memory=SamConfig(page_turns=1, live_capacity_turns=4, keep_recent_turns=3),
        reasoner_max_pages=2,
        batch_size=16,
    )


class Replay:
    """A memory policy that answers each prompt with the output a dataset row recorded for it (empty if none)."""

    name = "replay"

    def __init__(self, rows: list[SFTExample]) -> None:
        self.outputs = {(r.task_id, self.key(r.messages[:-1])): r.messages[-1].content for r in rows}
        self.used: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    @staticmethod
    def key(messages: list[Any]) -> tuple[tuple[str, str], ...]:
        return tuple((role_of(m), content_of(m)) for m in messages)

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        key = (metadata["task_id"], self.key(messages))
        self.used.add(key)
        return self.outputs.get(key, "")


def test_distill_with_a_30pct_wrong_oracle_keeps_only_correct_trajectories_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="memrl")
    cfg = noisy_sam_distill(tmp_path, "noisy")
    out = tmp_path / "noisy" / "sft"

    # killed after the first batch of 16 trajectories
    real_run = expert_traces.run_rollouts
    batches = {"n": 0}

    def dying_run(*args: Any, **kwargs: Any) -> Any:
        batches["n"] += 1
        if batches["n"] == 2:
            raise Killed
        return real_run(*args, **kwargs)

    monkeypatch.setattr(expert_traces, "run_rollouts", dying_run)
    with pytest.raises(Killed):
        run_distill(cfg)
    monkeypatch.setattr(expert_traces, "run_rollouts", real_run)
    assert len(list(iter_jsonl(out / distill.PROGRESS_FILE))) == 16
    assert run_distill(noisy_sam_distill(tmp_path, "noisy", resume=True)) == 0
    assert "resuming: 16 traces already written" in caplog.text

    # the resumed run wrote exactly what an uninterrupted run writes, and a rerun of a finished run adds nothing
    run_distill(noisy_sam_distill(tmp_path, "straight"))
    roles = ("consolidate", "recall")
    for role in roles:
        assert role_file(out, role).read_bytes() == role_file(tmp_path / "straight" / "sft", role).read_bytes()
    before = {role: role_file(out, role).read_bytes() for role in roles}
    run_distill(noisy_sam_distill(tmp_path, "noisy", resume=True))
    assert {role: role_file(out, role).read_bytes() for role in roles} == before

    progress = list(iter_jsonl(out / distill.PROGRESS_FILE))
    assert sorted(e["task_id"] for e in progress) == sorted(t.task_id for t in load_tasks(cfg.tasks, "distill"))
    stats = json.loads((out / distill.STATS_FILE).read_text())
    kept = {e["task_id"] for e in progress if e["kept"]}
    assert stats["traces"]["total"] == 40 and stats["traces"]["kept"] == len(kept)
    assert 0 < len(kept) < 40  # the 30% expert errors cost some trajectories their answer, and they were rejected
    assert all(e["outcome"] == 1.0 for e in progress if e["kept"])
    assert all(e["outcome"] < 1.0 for e in progress if not e["kept"])
    rows = [r for role in roles for r in load_sft_examples(role_file(out, role))]
    assert len({r.row_id for r in rows}) == len(rows)
    assert {r.task_id for r in rows} == kept and all(r.metadata["outcome"] == 1.0 for r in rows)

    # replay: the kept rows alone drive each kept task to the correct answer, as judged by the task's verifier
    tasks = {t.task_id: t for t in load_tasks(cfg.tasks, "distill")}
    replay = Replay(rows)
    engines = EngineSet(
        reasoner=ScriptedEngine(SamReasoner(max_pages=cfg.reasoner_max_pages)), memory=ScriptedEngine(replay)
    )
    traces = run_rollouts([sam_rollout(tasks[i], cfg.sam_memory, rollout_id="replay") for i in sorted(kept)], engines)
    for trace in traces:
        assert trace.outcome == 1.0 and trace.answer == tasks[trace.task_id].answer
        assert not any(c.error for c in trace.memory_calls)
    assert replay.used == set(replay.outputs)  # every row was a call of the replayed trajectories, none is missing


@pytest.mark.parametrize(
    ("distill_file", "sft_file", "family_roles"),
    [
        ("distill_tiny.yaml", "sft_tiny.yaml", {"consolidate", "recall"}),
        ("distill_sam_qwen3.5-9b.yaml", "sft_sam_qwen3.5-9b.yaml", {"consolidate", "recall"}),
        ("distill_proactive_qwen3.5-27b.yaml", "sft_proactive_qwen3.5-27b.yaml", {"bank_edit", "intervene"}),
    ],
)
def test_each_sft_config_reads_what_a_distill_config_writes(
    distill_file: str, sft_file: str, family_roles: set[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memrl.train.sft import SFTRunConfig

    cfg = load_config(DistillRunConfig, CONFIGS / distill_file)
    sft = load_config(SFTRunConfig, CONFIGS / sft_file)
    assert cfg.command == "data distill" and sft.command == "sft"
    assert set(sft.data.role_names) <= family_roles  # the distilled family has the roles the SFT trains on
    assert cfg.rejection.roles is None or set(sft.data.role_names) <= set(cfg.rejection.roles)
    if cfg.expert is not None:  # a paper setup: a frontier expert behind an OpenAI-compatible endpoint
        assert cfg.expert.backend == "openai" and cfg.expert.endpoints
        assert all(e.api_key_env and e.url.startswith("https://") for e in cfg.expert.endpoints)

    # where the real runner writes (paths relative to the working directory, like the SFT config's), without the expert
    written: list[Path] = []
    monkeypatch.setattr(expert_traces, "distill", lambda _cfg, out: written.append(Path(out)) or {})
    monkeypatch.chdir(tmp_path)
    assert run_distill(cfg) == 0
    assert written == [Path(sft.data.dir)]
    assert (tmp_path / sft.data.dir / "config.yaml").is_file()  # the run's resolved config sits beside the datasets


def test_the_tiny_distill_config_writes_the_roles_sft_tiny_trains_on(tmp_path: Path) -> None:
    from memrl.train.sft import SFTRunConfig
    from memrl.train.sft_data import load_role_rows

    cfg = load_config(
        DistillRunConfig,
        CONFIGS / "distill_tiny.yaml",
        [f"run.output_dir={tmp_path}", f"out={tmp_path / 'distill-tiny'}", "tasks.count=24", "tokenizer=null"],
    )
    sft = load_config(SFTRunConfig, CONFIGS / "sft_tiny.yaml", [f"data.dir={tmp_path / 'distill-tiny'}"])
    run_distill(cfg)
    stats = json.loads((tmp_path / "distill-tiny" / distill.STATS_FILE).read_text())
    assert stats["traces"]["kept"] == 24  # the tiny recipe's expert answers every task
    rows = load_role_rows(sft.data)  # what `memrl sft` would read
    assert set(rows) == set(sft.data.role_names) and all(rows.values())
