"""Synthetic data figures: token-length accuracy per bin (4K..128K), generation time of an episode with its QA, QA
validity by replay, and the token counter's calibration against the tiny tokenizer. Prints one JSON object last.

    .venv/bin/python -m benchmarks.synth_speed [--quick]
"""

from __future__ import annotations

import time

from benchmarks.harness import bench_parser, emit, pin_threads
from memrl.data.envs import count_tokens
from memrl.data.qa import check_qa, replay_views
from memrl.data.tasks import ProactiveTask, SamTask, make_ama_episode

BINS = [4096, 8192, 16384, 32768, 65536, 131072]


def main() -> None:
    parser = bench_parser(__doc__, seed=False)
    parser.add_argument("--quick", action="store_true", help="bins up to 16K, no tokenizer calibration")
    args = parser.parse_args()
    pin_threads(args.threads)
    bins = BINS[:3] if args.quick else BINS
    rows = []
    qa_total = qa_wrong = 0
    for env in ("textworld", "gridworld"):
        for target in bins:
            start = time.perf_counter()
            ep = make_ama_episode(env, {}, seed=target, target_tokens=target, noise=0.1)
            seconds = time.perf_counter() - start
            views = replay_views(ep.env, ep.trajectory)
            wrong = sum(bool(check_qa(q, ep.trajectory, views)) for q in ep.qa_pairs)
            qa_total += len(ep.qa_pairs)
            qa_wrong += wrong
            rows.append(
                {
                    "family": "ama",
                    "env": env,
                    "target": target,
                    "tokens": ep.horizon_tokens,
                    "rel_error": round(abs(ep.horizon_tokens - target) / target, 4),
                    "turns": len(ep.trajectory),
                    "qa": len(ep.qa_pairs),
                    "qa_wrong": wrong,
                    "seconds": round(seconds, 3),
                }
            )
            emit(rows[-1])
        for target in bins:
            start = time.perf_counter()
            ep = SamTask({"horizon_steps": None, "target_tokens": target}, seed=target).episode()
            rows.append(
                {
                    "family": "sam",
                    "target": target,
                    "tokens": ep.horizon_tokens,
                    "rel_error": round(abs(ep.horizon_tokens - target) / target, 4),
                    "turns": len(ep.trajectory),
                    "seconds": round(time.perf_counter() - start, 3),
                }
            )
            emit(rows[-1])
    start = time.perf_counter()
    ProactiveTask({"n_subtasks": 200}, seed=0).episode()
    proactive_s = time.perf_counter() - start
    calibration = {}
    if not args.quick:
        from memrl.rollout.models import build_tokenizer

        tok = build_tokenizer()
        samples = {
            "textworld": make_ama_episode("textworld", {}, 1, 8192),
            "gridworld": make_ama_episode("gridworld", {}, 1, 8192),
            "sam": SamTask({"horizon_steps": 200}, seed=1).episode(),
            "proactive": ProactiveTask({"n_subtasks": 60}, seed=1).episode(),
        }
        for name, ep in samples.items():
            text = "\n".join(f"{t.action}\n{t.observation}" for t in ep.trajectory)
            calibration[name] = round(len(tok(text)["input_ids"]) / count_tokens(text), 3)
    ama = [r for r in rows if r["family"] == "ama"]
    summary = {
        "max_rel_error_ama": max(r["rel_error"] for r in ama),
        "max_rel_error_sam": max(r["rel_error"] for r in rows if r["family"] == "sam"),
        "seconds_at_max_bin_ama": {r["env"]: r["seconds"] for r in ama if r["target"] == bins[-1]},
        "seconds_at_max_bin_sam": max(r["seconds"] for r in rows if r["family"] == "sam" and r["target"] == bins[-1]),
        "proactive_200_subtasks_seconds": round(proactive_s, 3),
        "qa_checked": qa_total,
        "qa_wrong": qa_wrong,
        "tiny_tokenizer_tokens_per_counted_token": calibration,
        "bins": bins,
    }
    emit(summary, args.json_out)


if __name__ == "__main__":
    main()
