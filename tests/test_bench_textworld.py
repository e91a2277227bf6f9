"""benchmarks/textworld.py: per-stage records (reused when their inputs match, refused naming the fields when not), a
sitting that stops cleanly between stages, the figures over SFT and RL draws, and the staged run stopped, committed
and resumed from its records in a fresh clone."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.bench_run import bench_process


def records(root: Path, **budget: object) -> object:
    from benchmarks.textworld import Records

    return Records(root=root, deadline=budget.get("deadline"), max_stages=budget.get("max_stages"), ran=[], commit="x")


def test_a_recorded_stage_is_reused_and_other_inputs_are_refused_naming_them(tmp_path: Path) -> None:
    from benchmarks.textworld import RecordMismatch

    rec = records(tmp_path)
    calls: list[int] = []
    inputs = {"seed": 0, "steps": 30, "games": ["test-400000"]}
    assert rec.run("sft/seed0", inputs, lambda: calls.append(1) or {"weights": "abc"}) == {"weights": "abc"}
    again = records(tmp_path)
    assert again.run("sft/seed0", dict(inputs), lambda: calls.append(2) or {}) == {"weights": "abc"}
    assert calls == [1] and again.ran == []
    saved = json.loads((tmp_path / "sft" / "seed0.json").read_text())
    assert saved["inputs"] == inputs and saved["seconds"] >= 0 and saved["commit"] == "x"
    with pytest.raises(RecordMismatch, match=r"seed0.json: recorded with other inputs \(steps\)"):
        again.run("sft/seed0", {**inputs, "steps": 31}, dict)


def test_processes_of_one_run_share_its_stages_through_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage another live process holds is left to it (``elsewhere_ok``) or waited for and read from its record;
    a claim whose process is gone is taken over; a finished stage leaves no claim."""
    import subprocess
    import sys
    import threading

    from benchmarks.harness import Claims
    from benchmarks.textworld import Records

    def rec() -> Records:
        return Records(tmp_path / "records", None, None, [], "x", claims=Claims(tmp_path / "claims"), poll_s=0.05)

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim = tmp_path / "claims" / "eval" / "c0.pid"
        claim.parent.mkdir(parents=True)
        claim.write_text(str(other.pid))
        computed: list[str] = []
        assert rec().run("eval/c0", {}, lambda: computed.append("c0") or {}, elsewhere_ok=True) is None
        assert computed == []
        holder = rec()

        def finish_elsewhere() -> None:  # the other process records the stage and lets its claim go
            time.sleep(0.3)
            holder.path("eval/c0").parent.mkdir(parents=True, exist_ok=True)
            holder.path("eval/c0").write_text(json.dumps({"inputs": {}, "result": {"games": 1}}))
            claim.unlink()

        thread = threading.Thread(target=finish_elsewhere)
        thread.start()
        assert rec().run("eval/c0", {}, lambda: computed.append("c0") or {}) == {"games": 1}
        thread.join()
        assert computed == []
    finally:
        other.kill()
        other.wait()
    (tmp_path / "claims" / "sft.pid").write_text(str(other.pid))  # left by a process that is gone
    assert rec().run("sft", {}, lambda: {"n": 2}) == {"n": 2}
    assert [p for p in (tmp_path / "claims").rglob("*") if p.is_file()] == []
    link, tries = os.link, []

    def released_in_between(src: object, dst: object) -> None:  # the holder lets go between our link and our look
        tries.append(dst)
        if len(tries) == 1:
            raise FileExistsError(dst)
        link(src, dst)

    monkeypatch.setattr(os, "link", released_in_between)
    assert rec().run("games", {}, lambda: {"n": 3}) == {"n": 3} and len(tries) == 2


def test_a_checkpoint_this_machine_lacks_is_rebuilt_by_one_process_while_the_others_wait(tmp_path: Path) -> None:
    """``Records.rebuild``: a process rebuilding a recorded stage's checkpoint holds the stage's claim; another
    waits for it and does not rebuild once it is there; a dead rebuilder's claim is taken over; a checkpoint that is
    here is not rebuilt; nothing is left claimed."""
    import subprocess
    import sys
    import threading

    from benchmarks.harness import Claims
    from benchmarks.textworld import Records

    def rec() -> Records:
        return Records(tmp_path / "records", None, None, [], "x", claims=Claims(tmp_path / "claims"), poll_s=0.05)

    checkpoint, computed = tmp_path / "ckpt", []
    claim = tmp_path / "claims" / "sft" / "seed0.pid"
    claim.parent.mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim.write_text(str(other.pid))

        def rebuilt_elsewhere() -> None:
            time.sleep(0.3)
            checkpoint.write_text("weights")
            claim.unlink()

        thread = threading.Thread(target=rebuilt_elsewhere)
        thread.start()
        assert rec().rebuild("sft/seed0", checkpoint.exists, lambda: computed.append(1) or {}) is None
        thread.join()
        assert computed == []
    finally:
        other.kill()
        other.wait()
    claim.write_text(str(other.pid))  # its process is gone
    checkpoint.unlink()
    assert rec().rebuild("sft/seed0", checkpoint.exists, lambda: {"weights": "w"}) == {"weights": "w"}
    checkpoint.write_text("weights")
    assert rec().rebuild("sft/seed0", checkpoint.exists, lambda: computed.append(2) or {}) is None
    assert computed == [] and [p for p in (tmp_path / "claims").rglob("*") if p.is_file()] == []


@pytest.mark.timeout(60)  # a run not left to the holder waits for it: the claim's process outlives the test
def test_an_rl_run_whose_next_stage_another_process_holds_is_left_to_it(tmp_path: Path) -> None:
    """``TextWorldRun.rl(elsewhere_ok=True)``, as each process's first pass over the RL runs: a run is trained up to
    the first stage (a sitting or its summary) another live process holds and then left to it (None); a run nobody
    holds is trained sitting by sitting to its summary; a recorded run is rebuilt only when its weights are asked
    for."""
    import subprocess
    import sys
    from dataclasses import replace

    from benchmarks.harness import Claims
    from benchmarks.textworld import SMOKE, Records, TextWorldRun

    rec = Records(tmp_path / "records", None, None, [], "x", claims=Claims(tmp_path / "claims"), poll_s=0.05)
    args = argparse.Namespace(rl_block_iterations=2, rl_workers=1)
    bench = TextWorldRun(args, replace(SMOKE, iterations=6), rec, tmp_path / "work")  # sittings to 2 and 4
    bench.sft_inputs = lambda seed: {"seed": seed}  # type: ignore[method-assign]
    trained: list[tuple[str, int | None]] = []

    def train_rl(mode, sft_seed, rl_seed, lr, out, name, stop=None):  # type: ignore[no-untyped-def]
        trained.append((name, stop))
        return {"checkpoint": f"{name}-{stop}"} if stop is not None else {"weights": name}

    bench.train_rl = train_rl  # type: ignore[method-assign]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        for held in ("rl/tree-sft0-rl0/to-iter4", "rl/flat-sft0-rl0"):
            (tmp_path / "claims" / f"{held}.pid").parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "claims" / f"{held}.pid").write_text(str(other.pid))
        assert bench.rl("tree", 0, 0, 1e-4, elsewhere_ok=True) is None
        assert bench.rl("flat", 0, 0, 1e-4, elsewhere_ok=True) is None
        assert trained == [("tree-sft0-rl0", 2), ("flat-sft0-rl0", 2), ("flat-sft0-rl0", 4)]
        trained.clear()
        out, summary = bench.rl("flat", 0, 1, 1e-4, elsewhere_ok=True)
        assert summary == {"weights": "flat-sft0-rl1"} and out == tmp_path / "work" / "rl" / "flat-sft0-rl1-final"
        assert trained == [("flat-sft0-rl1", 2), ("flat-sft0-rl1", 4), ("flat-sft0-rl1", None)]
        trained.clear()  # on a machine without the run's weights: its summary is read, the weights rebuilt if asked
        assert bench.rl("flat", 0, 1, 1e-4) == (out, summary) and trained == []
        assert bench.rl("flat", 0, 1, 1e-4, weights=True) == (out, summary)
        assert trained == [("flat-sft0-rl1", 2), ("flat-sft0-rl1", 4), ("flat-sft0-rl1", None)]
    finally:
        other.kill()
        other.wait()


def test_rl_runs_go_sft_seed_by_sft_seed_each_seed_trained_then_evaluated(tmp_path: Path) -> None:
    """``run``'s RL phase: SFT seed k's runs get a first pass (``elsewhere_ok``: two processes train two at once), then
    each is trained and evaluated, all before seed k + 1's runs start; a sitting that ends then leaves whole seeds.
    The RL variants play the first ``rl_test_games`` test games; the status counts the dev selection's stages."""
    from dataclasses import replace
    from types import SimpleNamespace

    from benchmarks.textworld import SMOKE, TextWorldRun, run

    args = argparse.Namespace(
        skip=("sam_untrained", "sam_sft"), model="tiny", engine="hf", reasoner_tokenizer="smollm2", chunk=2,
        sft_block_steps=0, rl_block_iterations=0, select=True, dev_games=3, lr=1e-4, worker=False, jobs=1,
    )  # fmt: skip
    scale = replace(SMOKE, sft_seeds=2, rl_seeds=1, rl_test_games=5)
    bench = TextWorldRun(args, scale, records(tmp_path, max_stages=0), tmp_path)
    calls: list[tuple[object, ...]] = []

    def games(split: str, n: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(task_id=f"{split}{i}", horizon_label="c") for i in range(n)]

    def evaluate(variant: str, tag: str, tasks: list[SimpleNamespace], *_: object) -> dict[str, object]:
        calls.append(("eval", variant, tag, [t.task_id for t in tasks][-1]))
        return {}

    def rl(
        mode: str, k: int, j: int, lr: float, tag: str = "", elsewhere_ok: bool = False, weights: bool = False
    ) -> tuple[Path, dict[str, str]]:
        calls.append(("rl", mode, k, elsewhere_ok) if not tag else ("select", tag))
        return tmp_path, {"weights": f"{mode}{k}"}

    bench.games, bench.evaluate, bench.rl = games, evaluate, rl  # type: ignore[method-assign,assignment]
    bench.dev_success = lambda *_: 0.5  # type: ignore[method-assign]
    bench.sft_weights = lambda k: f"sft{k}"  # type: ignore[method-assign]
    status = run(bench)  # stops before the replay check, the stage after the last evaluation
    assert status["stopped_before"] == "replay"
    rl_phase = [c for c in calls if c[0] == "rl" or c[1] in ("sam_oat", "sam_flat")]
    assert rl_phase == [
        *[("rl", "tree", 0, True), ("rl", "flat", 0, True)],
        *[("rl", "tree", 0, False), ("eval", "sam_oat", "sft0/rl0", "test4"), ("rl", "flat", 0, False)],
        ("eval", "sam_flat", "sft0/rl0", "test4"),
        *[("rl", "tree", 1, True), ("rl", "flat", 1, True)],
        *[("rl", "tree", 1, False), ("eval", "sam_oat", "sft1/rl0", "test4"), ("rl", "flat", 1, False)],
        ("eval", "sam_flat", "sft1/rl0", "test4"),
    ]
    assert ("eval", "long_context", "scripted", "test15") in calls  # the other variants play all 16
    left = status["remaining"]
    assert left["eval/sft0/rl0/sam_oat"]["stages"] == 3 and left["eval/scripted/long_context"]["stages"] == 8
    assert left["rl/select-lr0.001-tree-sft0-rl0"]["stages"] == 1 and left["eval/dev-sft/sam_sft"]["stages"] == 2
    assert left["eval/dev-select-lr0.0001/sam_sft"]["stages"] == 2 and left["games/dev"]["stages"] == 1


def test_a_sitting_stops_before_the_first_stage_past_its_budget(tmp_path: Path) -> None:
    """``--max-stages`` N runs N stages and stops before the next; ``--max-minutes`` stops before a stage that would
    start past the deadline, a signal before the next stage; recorded stages are read whatever the budget."""
    from benchmarks.textworld import Stopped

    rec = records(tmp_path, max_stages=1)
    rec.run("a", {}, lambda: {"n": 1})
    with pytest.raises(Stopped, match="b"):
        rec.run("b", {}, lambda: {"n": 2})
    late = records(tmp_path, deadline=time.perf_counter() - 1)
    assert late.run("a", {}, dict) == {"n": 1}
    with pytest.raises(Stopped):
        late.run("b", {}, lambda: {"n": 2})
    assert not (tmp_path / "b.json").exists()
    signalled = records(tmp_path)
    signalled.stop_requested = True  # SIGTERM: the running stage finished, no other starts
    with pytest.raises(Stopped):
        signalled.run("b", {}, lambda: {"n": 2})


def test_a_stopped_run_pairs_only_the_draws_that_cover_every_test_game(tmp_path: Path) -> None:
    """``figures_of_finished_draws``: a draw whose chunks cover every test game (an RL draw: the first
    ``rl_test_games``) is paired, on the games both sides played; one a chunk short, or a dev evaluation, is left out;
    nothing before the test games are recorded."""
    from benchmarks.textworld import figures_of_finished_draws, played_games

    rec = records(tmp_path)
    assert figures_of_finished_draws(rec, played_games(rec)) is None

    def game(won: float) -> dict[str, object]:
        return {
            "won": won,
            "cell": "c",
            "steps": 3,
            "reasoner_tokens": 10,
            "reasoner_tokens_spent": 10,
            "peak_context": 5,
        }

    def chunk(stage: str, won: dict[str, float]) -> None:
        rec.path(stage).parent.mkdir(parents=True, exist_ok=True)
        rec.path(stage).write_text(json.dumps({"result": {"games": {g: game(w) for g, w in won.items()}}}))

    rec.path("games/test").parent.mkdir(parents=True)
    rec.path("games/test").write_text(json.dumps({"result": {"z8_sha256": {"g0": "a", "g1": "b", "g2": "c"}}}))
    chunk("eval/scripted/long_context/0000-0001", {"g0": 0.0, "g1": 1.0})
    chunk("eval/scripted/long_context/0002-0002", {"g2": 0.0})
    chunk("eval/sft0/sam_sft/0000-0001", {"g0": 1.0, "g1": 1.0})
    chunk("eval/sft0/sam_sft/0002-0002", {"g2": 1.0})
    chunk("eval/sft1/sam_sft/0000-0001", {"g0": 0.0, "g1": 0.0})  # its last chunk not run yet
    chunk("eval/dev-sam_sft/sam_sft/0000-0002", {"g0": 0.0, "g1": 0.0, "g2": 0.0})
    chunk("eval/sft0/rl0/sam_oat/0000-0001", {"g0": 1.0, "g1": 0.0})  # the RL variants play the first 2 games
    out = figures_of_finished_draws(rec, played_games(rec))
    assert out is not None and out["table"]["sam_sft"]["all"]["draws"] == 1
    assert out["table"]["sam_sft"]["all"]["success"] == 1.0
    assert out["paired"]["sam_sft-long_context"]["all"]["mean"] == pytest.approx(2 / 3)
    assert "sam_oat" not in out["table"]  # short of every test game
    rl = figures_of_finished_draws(rec, played_games(rec), rl_test_games=2)
    assert rl is not None and rl["table"]["sam_oat"]["all"] == pytest.approx(
        rl["table"]["sam_oat"]["all"] | {"games": 2, "success": 0.5}
    )
    assert rl["paired"]["sam_oat-sam_sft"]["all"]["mean"] == -0.5  # on the 2 games both played
    assert rl["paired"]["sam_oat-sam_sft"]["all"]["games"] == 2
    assert figures_of_finished_draws(rec, played_games(rec), rl_test_games=3)["table"].keys() == out["table"].keys()


def test_figures_pair_each_draw_with_its_own_sft_and_count_tokens_at_equal_cost() -> None:
    """An RL draw ``sft1/rl0`` is paired with SFT seed 1 (never a copy of seed 0); success at long context's cost
    counts a game won on no more reasoner tokens than long context spent on it."""
    from benchmarks.textworld import figures

    games, cells = ["g0", "g1"], {"g0": "c", "g1": "c"}

    def game(won: float, tokens: int) -> dict[str, object]:
        return {
            "won": won,
            "steps": 3,
            "reasoner_tokens": tokens,
            "reasoner_tokens_spent": tokens // 2,
            "peak_context": 10,
        }

    evals = {
        "long_context": {"scripted": {"g0": game(1.0, 100), "g1": game(0.0, 900)}},
        "sam_expert": {"scripted": {"g0": game(1.0, 90), "g1": game(1.0, 95)}},
        "sam_sft": {
            "sft0": {"g0": game(1.0, 101), "g1": game(0.0, 50)},
            "sft1": {"g0": game(1.0, 40), "g1": game(1.0, 60)},
        },
        "sam_oat": {
            "sft0/rl0": {"g0": game(1.0, 40), "g1": game(0.0, 50)},
            "sft1/rl0": {"g0": game(1.0, 40), "g1": game(1.0, 60)},
        },
    }
    out = figures(evals, games, cells)
    sft = out["table"]["sam_sft"]["all"]
    assert sft["success"] == 0.75 and sft["draws"] == 2 and sft["reasoner_tokens_per_game"] == pytest.approx(62.75)
    assert sft["reasoner_tokens_spent_per_game"] == pytest.approx(31.25)
    assert sft["success_at_long_context_cost"] == 0.5  # sft0/g0 spent 101 > 100; sft1 won both under the cost
    assert out["table"]["long_context"]["all"]["success_at_long_context_cost"] == 0.5
    oat_sft = out["paired"]["sam_oat-sam_sft"]["all"]
    assert oat_sft["per_seed_mean"] == [0.0, 0.0] and oat_sft["seeds"] == 2
    expert_sft = out["paired"]["sam_expert-sam_sft"]["all"]  # the expert against each SFT seed, not the first only
    assert expert_sft["per_seed_mean"] == [0.5, 0.0] and expert_sft["seeds"] == 2


def test_usage_errors_name_the_flag() -> None:
    from benchmarks.textworld import at_least_one, run_name, skipped_variants

    assert skipped_variants("sam_untrained,sam_flat") == ("sam_untrained", "sam_flat")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown variant 'bm25'"):
        skipped_variants("sam_flat,bm25")
    with pytest.raises(argparse.ArgumentTypeError, match="one path component"):
        run_name("a/b")
    assert at_least_one("--jobs", "processes")("1") == 1
    with pytest.raises(
        argparse.ArgumentTypeError, match="--jobs must be a whole number of processes, at least 1, got '0'"
    ):
        at_least_one("--jobs", "processes")("0")
    assert at_least_one("--sft-threads", "threads")("1") == 1
    with pytest.raises(argparse.ArgumentTypeError, match=r"--sft-threads must be .* threads, at least 1, got '-2'"):
        at_least_one("--sft-threads", "threads")("-2")


# protects: the staged benchmark on real TextWorld games and the tiny model, stopped between stages and resumed from
# its committed records in a fresh clone, the SFT checkpoint rebuilt there to the recorded weights
@pytest.mark.slow
def test_a_stopped_run_resumes_from_its_committed_records_in_a_fresh_clone(tmp_path: Path) -> None:
    pytest.importorskip("textworld", reason="the textworld extra is not installed")
    origin = tmp_path / "origin"
    (origin / "records").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(origin)], check=True)

    def bench(repo: Path, work: str, *extra: str) -> subprocess.CompletedProcess[str]:
        args = [
            "--smoke",
            "--model",
            "tiny",
            "--skip",
            "sam_untrained,sam_oat,sam_flat",
            "--cells",
            "treasure_hunter/medium",
            "--test-games",
            "2",
            "--chunk",
            "1",
            "--sft-games",
            "1",
            "--sft-steps",
            "2",
            "--sft-seeds",
            "1",
            "--max-steps",
            "20",
            "--reasoner-tokenizer",
            "tiny",
            "--threads",
            "1",
            "--run",
            "tiny",
            "--records",
            str(repo / "records"),
            "--work",
            str(tmp_path / work),
            "--game-cache",
            str(tmp_path / "games"),
            "--model-cache",
            str(tmp_path / "models"),
            *extra,
        ]
        out = bench_process("textworld", args, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    # test games, 4 scripted variants x 2 chunks, SFT games, distill, SFT seed 0: stopped before its first evaluation
    first = json.loads(bench(origin, "work-a", "--max-stages", "12").stdout.splitlines()[-1])
    assert first["complete"] is False and first["stopped_before"] == "eval/sft0/sam_sft/0000-0000"
    assert first["remaining"]["eval/sft0/sam_sft"]["stages"] == 2
    # The game cache is the machine's (games are keyed by settings and seed); the SFT game (seed 0) is taken out of
    # it, so the resumed run generates it again and its rebuilt SFT weights matching the record show that a game
    # regenerates identically in another process.
    (sft_game,) = (tmp_path / "games").glob("*/*-s0-*")
    shutil.rmtree(sft_game)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "-C", str(origin), "add", "records"], check=True)
    subprocess.run([*git, "-C", str(origin), "commit", "-qm", "records"], check=True)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True)
    # a fresh work folder (no checkpoint, no distilled rows, no SFT game) and two processes sharing the run: one
    # rebuilds the SFT checkpoint while the other waits, and each missing stage runs once, in one of them
    resumed = bench(clone, "work-b", "--jobs", "2")
    result = json.loads(resumed.stdout.splitlines()[-1])
    assert result["complete"] is True and resumed.stdout.count('{"benchmark"') == 1  # the worker reports nothing
    started = re.findall(r"^\[textworld(?: w1)?\] stage (\S+)$", resumed.stderr, re.M)
    assert sorted(started) == ["eval/sft0/sam_sft/0000-0000", "eval/sft0/sam_sft/0001-0001", "replay"]
    assert set(result["stages_run"]) <= set(started)
    assert resumed.stderr.count("SFT seed 0 rebuilt: weights match the record") == 1
    assert result["rebuilt_weights_differ"] == []
    assert set(result["table"]) == {"no_memory", "long_context", "bm25", "sam_expert", "sam_sft"}
    assert result["table"]["sam_expert"]["all"]["success"] == 1.0 and result["replay"]["exact"] == 2
    assert result["table"]["long_context"]["all"]["reasoner_tokens_per_game"] > 0
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"], capture_output=True, text=True)
    modified = {line[3:] for line in status.stdout.splitlines() if not line.startswith("??")}
    assert modified == {"records/tiny/status.json"}  # every committed stage record was read, none rewritten


def test_the_hours_left_are_estimated_from_stages_of_the_same_kind(tmp_path: Path) -> None:
    """Another seed's SFT sittings, another draw's chunks of the same variant and another RL run's sittings of the
    same mode time the stages not run yet; a kind never run is counted apart, not as zero hours."""
    import json

    from benchmarks.textworld import estimate_hours

    rec = records(tmp_path)
    for stage, seconds in (
        ("sft/seed0/to-step16", 100.0),
        ("sft/seed0/to-step32", 300.0),
        ("eval/sft0/sam_sft/0-9", 10.0),
        ("games/test", 7.0),
        ("rl/flat-sft0-rl0/to-iter5", 50.0),
    ):
        rec.run(stage, {}, dict)
        record = json.loads(rec.path(stage).read_text())
        rec.path(stage).write_text(json.dumps({**record, "seconds": seconds}))
    (tmp_path / "run.json").write_text("{}")  # the run's settings: not a stage
    left = estimate_hours(
        rec,
        {
            "sft/seed0": 2,
            "sft/seed1": 4,
            "eval/sft1/sam_sft": 3,
            "rl/tree-sft0-rl0": 1,
            "rl/flat-sft1-rl0": 2,  # timed by another run's sitting of the same mode
            "games/test": 1,
        },
        jobs=2,
    )
    assert left["sft/seed1"] == {"stages": 4, "seconds_each": 200.0}
    assert left["eval/sft1/sam_sft"]["seconds_each"] == 10.0 and left["rl/tree-sft0-rl0"]["seconds_each"] is None
    assert left["games/test"]["seconds_each"] == 7.0
    assert left["rl/flat-sft1-rl0"]["seconds_each"] == 50.0
    assert left["hours"] == round((6 * 200.0 + 3 * 10.0 + 7.0 + 2 * 50.0) / 3600, 2) and left["untimed_stages"] == 1
    assert left["wall_hours"] == round((6 * 200.0 + 3 * 10.0 + 7.0 + 2 * 50.0) / 3600 / 2, 2) and left["jobs"] == 2


def test_the_status_names_the_command_that_goes_on_without_the_sittings_budget() -> None:
    from benchmarks.textworld import resume_arguments

    argv = ["--model", "smollm2", "--max-stages", "0", "--run", "r", "--max-minutes=80", "--skip", "sam_oat"]
    assert resume_arguments(argv) == ["--model", "smollm2", "--run", "r", "--skip", "sam_oat"]


def test_the_status_names_the_first_stage_still_missing_when_another_process_recorded_the_stop() -> None:
    from benchmarks.textworld import first_missing

    missing = {"games/test": 0, "eval/sft2/sam_sft": 0, "rl/tree-sft0-rl0": 3}
    assert first_missing("eval/sft2/sam_sft/0025-0049", set(), missing) == "eval/sft2/sam_sft/0025-0049"
    done = {"eval/sft2/sam_sft/0025-0049"}
    assert first_missing("eval/sft2/sam_sft/0025-0049", done, missing) == "rl/tree-sft0-rl0"
    assert first_missing("eval/sft2/sam_sft/0025-0049", done, {**missing, "rl/tree-sft0-rl0": 0}) == "replay"


def test_a_stopped_run_reports_what_its_finished_chunks_cover(tmp_path: Path) -> None:
    from benchmarks.textworld import finished_so_far, played_games

    rec = records(tmp_path)

    def chunk(*games: tuple[str, float, int]) -> dict[str, object]:
        return {"games": {g: {"won": won, "reasoner_tokens": tokens} for g, won, tokens in games}}

    rec.run("eval/scripted/long_context/0000-0001", {}, lambda: chunk(("g0", 1.0, 100), ("g1", 0.0, 300)))
    rec.run("eval/scripted/long_context/0002-0002", {}, lambda: chunk(("g2", 1.0, 200)))
    rec.run("eval/sft0/sam_sft/0000-0001", {}, lambda: chunk(("g0", 1.0, 10), ("g1", 1.0, 30)))
    rec.run("eval/dev-sft/sam_sft/0000-0000", {}, lambda: chunk(("d0", 0.0, 5)))  # dev: not a test figure
    assert finished_so_far(played_games(rec)) == {
        "long_context": {"scripted": {"games": 3, "success": 2 / 3, "reasoner_tokens_per_game": 200.0}},
        "sam_sft": {"sft0": {"games": 2, "success": 1.0, "reasoner_tokens_per_game": 20.0}},
    }


def test_a_weights_digest_needs_weights(tmp_path: Path) -> None:
    from benchmarks.textworld import digest_weights

    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        digest_weights(tmp_path)  # e.g. a checkpoint written in another format: not one digest for every run
    (tmp_path / "model.safetensors").write_bytes(b"a")
    first = digest_weights(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"b")
    assert digest_weights(tmp_path) != first
