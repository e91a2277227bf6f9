"""``launch/slurm/memrl.sbatch``: served models on dedicated nodes, the Ray rollout fleet and training on the rest
(:func:`plan_slurm`)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from memrl.data.config import ServedModel
from memrl.launch.layout.common import (
    LAUNCH_DIR,
    LaunchView,
    MemrlCommand,
    Plan,
    command_kind,
    help_plan,
    index_range,
    is_resumable,
    launch_view,
    launcher_args,
    launcher_parser,
    shell_command,
    text_table,
    train_layout,
)
from memrl.launch.layout.hosts import (
    Device,
    LaunchError,
    SlurmEnv,
    expand_hostlist,
    gpus_on_node,
    rendezvous_port,
)
from memrl.launch.layout.serve import ServeSpec, vllm_replicas
from memrl.launch.layout.torchrun import layout_info
from memrl.rollout.fleet import EngineSlot, plan_fleet

SETUPS: dict[str, dict[str, Any]] = {
    # SAM memory model (Qwen3.5-9B, trained): a frozen 35B-class reasoner (MoE, 4 x TP-2 servers per node) and an
    # open-weight committee member; the paper's frontier committee can be listed as API endpoints instead.
    "sam-9b": {
        "reasoner": "Qwen/Qwen3.5-35B-A3B,nodes=1,tp=2",
        "committee": ["Qwen/Qwen3.5-122B-A10B,nodes=1,tp=8"],
    },
    # Proactive intervention agent (Qwen3.5-27B, trained) beside a frozen 122B-class action agent; pivot-turn GRPO
    # scores continuations with verifiers, so no committee.
    "proactive-27b": {
        "reasoner": "Qwen/Qwen3.5-122B-A10B,nodes=2,tp=8",
        "committee": [],
    },
    "none": {"reasoner": None, "committee": []},
}
AUTO_SETUP = {"train oat-grpo": "sam-9b", "train pivot-grpo": "proactive-27b"}


@dataclass
class _Service:
    label: str  # reasoner, committee0, judge
    role: str
    spec: ServeSpec
    hosts: list[str]
    replicas: int
    ports: list[int]

    @property
    def endpoints(self) -> list[str]:
        return [f"http://{h}:{p}/v1" for h in self.hosts for p in self.ports]

    def served(self) -> ServedModel:
        return ServedModel(model=self.spec.served_name, endpoints=self.endpoints)


def _slurm_parser() -> argparse.ArgumentParser:
    parser = launcher_parser(
        "launch/slurm/memrl.sbatch",
        "Inside a Slurm job: start vLLM servers for the frozen reasoner / committee / judge on dedicated nodes, "
        "wait for their health checks, pass their endpoints to the run as placement.* overrides, train on the "
        "remaining nodes with launch/torchrun.sh, and stop the servers when training ends.",
    )
    parser.add_argument(
        "--setup",
        default="auto",
        choices=["auto", *SETUPS],
        help="served models of a paper setup (auto: sam-9b for 'train oat-grpo', proactive-27b for "
        "'train pivot-grpo', none otherwise)",
    )
    parser.add_argument("--reasoner", help="frozen reasoner / action agent spec, or 'none' (overrides the setup)")
    parser.add_argument(
        "--committee", action="append", help="committee member spec (repeat for several; 'none' for no committee)"
    )
    parser.add_argument("--judge", help="judge spec, or 'none' (default: none served)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes to plan for outside an allocation (dry run)")
    parser.add_argument("--hosts", help="host list to plan for instead of SLURM_JOB_NODELIST (dry run)")
    parser.add_argument("--gpus-per-node", type=int, help="default: SLURM_GPUS_ON_NODE (8 in a dry run outside Slurm)")
    parser.add_argument("--port", type=int, default=8000, help="port of the first server on every serving node")
    parser.add_argument("--master-port", type=int, help="training rendezvous port (default: from the job id)")
    parser.add_argument("--health-timeout", type=int, default=1800, help="seconds to wait for the servers (1800)")
    parser.add_argument("--ray-port", type=int, default=6379, help="port of the Ray head of the rollout fleet (6379)")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=20,
        help="requeue at most this many times when the time limit nears (SIGUSR1); 0 disables",
    )
    parser.add_argument("--log-dir", help="server logs and endpoints.yaml (default: RUN_DIR/slurm)")
    return parser


def _services(args: argparse.Namespace, stage: str) -> tuple[str, list[tuple[str, str, ServeSpec]]]:
    setup = AUTO_SETUP.get(stage, "none") if args.setup == "auto" else args.setup
    chosen = SETUPS[setup]
    reasoner = args.reasoner if args.reasoner is not None else chosen["reasoner"]
    committee = chosen["committee"] if args.committee is None else [c for c in args.committee if c.lower() != "none"]
    out = []
    if reasoner and reasoner.lower() != "none":
        out.append(("reasoner", "reasoner", ServeSpec.parse(reasoner)))
    out += [(f"committee{i}", "committee", ServeSpec.parse(c)) for i, c in enumerate(committee)]
    if args.judge and args.judge.lower() != "none":
        out.append(("judge", "judge", ServeSpec.parse(args.judge)))
    return setup, out


def plan_slurm(argv: Sequence[str], env: Mapping[str, str]) -> Plan:
    """Plan ``launch/slurm/memrl.sbatch [options] [--] COMMAND...`` for the whole allocation."""
    parser = _slurm_parser()
    args, command = launcher_args(parser, argv, "train oat-grpo --config FILE")
    if args.help:
        return help_plan(parser)
    slurm = SlurmEnv.from_env(env)
    if slurm is None and not args.dry_run:
        raise LaunchError("not inside a Slurm allocation: submit with sbatch, or plan with --dry-run")
    notes = []
    if args.hosts:
        hosts = expand_hostlist(args.hosts)
    elif slurm is not None and slurm.job_hosts:
        hosts = slurm.job_hosts
    else:
        hosts = [f"node{i + 1}" for i in range(args.nodes)]
        notes.append(f"no allocation: placeholder hosts {hosts[0]}..{hosts[-1]}")
    if args.gpus_per_node is not None:
        gpus = args.gpus_per_node
    elif slurm is not None:
        gpus = gpus_on_node(env)
    else:
        gpus = 8
        notes.append("no allocation: assuming 8 GPUs per node")
    device: Device = "gpu" if gpus > 0 else "cpu"
    job_id = slurm.job_id if slurm and slurm.job_id else "dryrun"
    memrl = MemrlCommand(command)
    stage = memrl.stage
    kind = command_kind("memrl.launch.cli", memrl)
    view = launch_view(memrl)
    setup, wanted = _services(args, stage)

    # Dedicated nodes for every served model, in order; training gets the rest.
    services: list[_Service] = []
    free = list(hosts)
    for label, role, spec in wanted:
        if len(free) < spec.nodes + 1:
            need = sum(s.nodes for _, _, s in wanted) + 1
            raise LaunchError(
                f"{len(hosts)} node(s) cannot hold the served models and training: {label} ({spec.model}) needs "
                f"{spec.nodes} node(s); the plan needs at least {need} (use more nodes, fewer servers, or --setup none)"
            )
        mine, free = free[: spec.nodes], free[spec.nodes :]
        count = spec.replicas_per_node(gpus, device)
        services.append(_Service(label, role, spec, mine, count, [args.port + i for i in range(count)]))
    train_hosts = free
    if not train_hosts:
        raise LaunchError("no node left for training")
    idle_hosts: list[str] = []
    if not kind.distributed:
        # One process: the first remaining node runs it, the others stay idle.
        train_hosts, idle_hosts = train_hosts[:1], train_hosts[1:]

    extra_overrides: list[str] = []
    run_name = view.run.name
    if run_name is None:
        # A fixed name lets a requeued job find its run directory and resume it.
        run_name = f"{(slurm.job_name if slurm and slurm.job_name else 'memrl')}-{job_id}"
        extra_overrides.append(f"run.name={run_name}")
    run_dir = Path(view.run.output_dir) / run_name
    log_dir = Path(args.log_dir) if args.log_dir else run_dir / "slurm"
    placement: dict[str, Any] = {}
    for role in ("reasoner", "judge"):
        chosen = [s for s in services if s.role == role]
        if chosen:
            placement[role] = chosen[0].served().model_dump(exclude_none=True)
            extra_overrides.append(f"placement.{role}={json.dumps(placement[role])}")
    committee = [s.served().model_dump(exclude_none=True) for s in services if s.role == "committee"]
    if committee:
        placement["committee"] = committee
        extra_overrides.append(f"placement.committee={json.dumps(committee)}")
    restarts = slurm.restart_count if slurm else 0
    resumable = is_resumable(stage)
    resume = restarts > 0 and resumable and not memrl.has_resume
    train_argv = [*command, *extra_overrides, *(["--resume"] if resume else [])]

    policy = view.placement.policy if kind.policy_engine else None
    master_port = rendezvous_port(args.master_port, env, slurm)
    layout = train_layout(
        nnodes=len(train_hosts), nproc_per_node=None if device == "gpu" else 1, node_rank=0,
        master_addr=train_hosts[0], master_port=master_port, device_choice=device, policy=policy,
        env={**env, "SLURM_GPUS_ON_NODE": str(gpus)}, hosts=train_hosts, kind=kind,
    )  # fmt: skip
    step_resources = ["--exclusive", "--kill-on-bad-exit=1"]
    if device == "gpu":
        step_resources += [f"--gpus-per-node={gpus}"]
    if slurm is not None and slurm.cpus_on_node:
        step_resources += [f"--cpus-per-task={slurm.cpus_on_node}"]

    def srun(nodes: list[str]) -> list[str]:
        return ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
                f"--nodelist={','.join(nodes)}", *step_resources]  # fmt: skip

    def srun_overlap(nodes: list[str]) -> list[str]:  # Ray shares the training nodes with the training step
        return ["srun", f"--nodes={len(nodes)}", "--ntasks=1", f"--nodelist={','.join(nodes)}", "--overlap",
                *([f"--gpus-per-node={gpus}"] if device == "gpu" else [])]  # fmt: skip

    shell: dict[str, str | list[str]] = {"serve_count": str(len(services))}
    serve_logs, serve_info = [], []
    lines = [
        f"memrl slurm: job {job_id}, {len(hosts)} node(s) x {gpus} GPU(s), setup {setup}"
        + (f" (auto for '{stage}')" if args.setup == "auto" else ""),
        *[f"note: {n}" for n in notes],
        f"run directory: {run_dir} (server logs and endpoints.yaml in {log_dir})",
    ]
    rows = []
    for s in services:
        for h in s.hosts:
            rows.append(
                [
                    h,
                    s.label,
                    f"{s.spec.served_name}: {s.replicas} server(s) x TP {s.spec.tp}, ports "
                    f"{index_range(s.ports[0], s.ports[-1])}",
                ]
            )
    for n in layout.nodes():
        if layout.single_process:
            rows.append([n["host"], "run", f"{kind.label}, one process"])
        else:
            rows.append([n["host"], "train", f"node rank {n['node']}, global ranks {index_range(*n['global_ranks'])}"])
    rows += [[h, "idle", f"nothing ({kind.label} runs in one process)"] for h in idle_hosts]
    lines += ["nodes:", *text_table(["host", "role", "runs"], rows)]
    for i, s in enumerate(services):
        replicas = vllm_replicas(
            s.spec, gpu_ids=[str(g) for g in range(gpus)], device=device, port=args.port, bind="0.0.0.0", extra=[]
        )
        serve_cmd = [
            *srun(s.hosts), "bash", str(LAUNCH_DIR / "serve_endpoints.sh"), "run",
            "--model", s.spec.model, "--served-model-name", s.spec.served_name,
            "--tp", str(s.spec.tp), "--replicas", str(s.replicas), "--port", str(args.port),
            "--max-model-len", str(s.spec.max_model_len).lower(),
            "--gpu-memory-utilization", f"{s.spec.gpu_memory_utilization:g}",
            "--device", device, "--log-dir", str(log_dir / s.label),
        ]  # fmt: skip
        shell[f"serve_{i}"] = serve_cmd
        serve_logs.append(str(log_dir / f"serve-{s.label}.log"))
        serve_info.append({"label": s.label, "role": s.role, "model": s.spec.model, "hosts": s.hosts,
                           "replicas_per_node": s.replicas, "ports": s.ports, "endpoints": s.endpoints,
                           "command": serve_cmd})  # fmt: skip
        lines += [
            f"[serve {s.label}] {shlex.join(serve_cmd)}",
            "  which starts on each of its nodes:",
            *[f"    {shell_command(e, c)}" for e, c, _ in replicas],
        ]
    fleet = _fleet_plan(
        view, kind.policy_engine, train_hosts if kind.distributed else train_hosts[:1], gpus, device, args.ray_port
    )
    ray_steps: list[list[str]] = []
    if fleet is not None:
        ray_steps = [[*srun_overlap([h]), *start] for h, start in fleet["starts"]]
        for i, step in enumerate(ray_steps):
            shell[f"ray_{i}"] = step
        engines = fleet["engines"]
        layout.fleet_engines = len(engines)
        lines += [
            f"rollout fleet: {len(engines)} engine(s) x TP {fleet['tp']} on {len(fleet['hosts'])} node(s) "
            f"({fleet['mode']}), Ray head {fleet['address']}; one RolloutWorker actor per engine",
            *text_table(
                ["host", "GPUs per engine"],
                [
                    [h, " ".join(",".join(map(str, e["gpus"])) for e in engines if e["host"] == h)]
                    for h in fleet["hosts"]
                ],
            ),
            *[f"[ray] {shlex.join(step)}" for step in ray_steps],
            f"[train] with RAY_ADDRESS={fleet['address']} (the driver on rank 0 joins the fleet)",
        ]
    health = [u.replace("/v1", "/health") for s in services for u in s.endpoints]
    if services:
        lines.append(f"[wait] up to {args.health_timeout} s for: {' '.join(health)}")
        lines.append("endpoints (as placement.* overrides of the run):")
        lines += [f"  {o}" for o in extra_overrides if o.startswith("placement.")]
    train_cmd = [
        *srun(train_hosts), "bash", str(LAUNCH_DIR / "torchrun.sh"),
        "--nnodes", str(layout.nnodes), "--nproc-per-node", str(layout.nproc_per_node),
        "--master-addr", layout.master_addr, "--master-port", str(master_port),
        "--device", device, "--", *train_argv,
    ]  # fmt: skip
    if layout.single_process:
        lines += [*layout.describe(this_node=False),
                  f"[run] {shlex.join(train_cmd)}"]  # fmt: skip
    else:
        lines += [*layout.describe(), f"[train] {shlex.join(train_cmd)}"]
    if services:
        lines.append("[stop] when training ends (or the job is cancelled / preempted): SIGTERM to the server steps")
    if resume:
        lines.append(f"restart {restarts} of this job: resuming the run with --resume")
    auto_requeue = resumable and args.max_restarts > 0
    lines.append(
        f"on SIGUSR1 (time limit near): requeue the job (restart {restarts + 1} of at most {args.max_restarts}); "
        "it resumes from the newest checkpoint"
        if auto_requeue
        else f"on SIGUSR1 (time limit near): nothing ('{stage}' cannot --resume or --max-restarts is 0)"
    )
    endpoints_text = yaml.safe_dump({"placement": placement}, sort_keys=False) if placement else ""
    shell.update(
        {
            "log_dir": str(log_dir),
            "serve_logs": serve_logs,
            "health_urls": health,
            "health_timeout": str(args.health_timeout),
            "endpoints_file": str(log_dir / "endpoints.yaml"),
            "endpoints_text": endpoints_text,
            "train_cmd": train_cmd,
            "auto_requeue": str(int(auto_requeue)),
            "ray_count": str(len(ray_steps)),
            "ray_address": fleet["address"] if fleet else "",
            "ray_nodes": str(len(fleet["hosts"])) if fleet else "0",
            "max_restarts": str(args.max_restarts),
        }
    )
    info = {
        "launcher": "slurm",
        "job_id": job_id,
        "setup": setup,
        "hosts": hosts,
        "gpus_per_node": gpus,
        "services": serve_info,
        "train_hosts": train_hosts,
        "idle_hosts": idle_hosts,
        "layout": layout_info(layout),
        "overrides": extra_overrides,
        "resume": resume,
        "run_dir": str(run_dir),
        "log_dir": str(log_dir),
        "placement": placement,
        "train_command": train_cmd,
        "health_urls": health,
        "fleet": {k: v for k, v in fleet.items() if k != "starts"} if fleet else None,
    }
    return Plan(lines, shell, info, args.dry_run)


def _fleet_plan(
    view: LaunchView, policy_engine: bool, hosts: list[str], gpus: int, device: Device, port: int
) -> dict[str, Any] | None:
    """The Ray rollout fleet on the training nodes (None when the run uses no fleet): a Ray head on the first node,
    a Ray worker on every other, each advertising only the GPUs the fleet may use there."""
    if not policy_engine or view.fleet.workers == 0:
        return None
    policy = view.placement.policy
    slots = (
        plan_fleet(policy, len(hosts), gpus)
        if device == "gpu"
        else [EngineSlot(node, (), False) for node in range(len(hosts))]
    )
    if view.fleet.workers is not None:
        if view.fleet.workers > len(slots):
            raise LaunchError(
                f"fleet.workers={view.fleet.workers}, but the training nodes have {len(slots)} engine "
                f"slot(s) ({policy.mode}, TP {policy.tensor_parallel_size})"
            )
        slots = slots[: view.fleet.workers]
    used = sorted({s.node for s in slots})
    address = f"{hosts[0]}:{port}"
    ray_start = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--block",
    ]
    starts = []
    for node in used if 0 in used else [0, *used]:  # the head on the first node, even without engines there
        fleet_gpus = sorted({g for s in slots if s.node == node for g in s.gpus})
        visible = [f"CUDA_VISIBLE_DEVICES={','.join(map(str, fleet_gpus))}"] if fleet_gpus else []
        role = ["--head", f"--port={port}"] if node == 0 else [f"--address={address}"]
        starts.append((hosts[node], ["env", *visible, *ray_start, *role, f"--num-gpus={len(fleet_gpus)}"]))
    return {
        "mode": policy.mode,
        "tp": policy.tensor_parallel_size,
        "address": address,
        "hosts": [hosts[n] for n in used],
        "engines": [{"host": hosts[s.node], "gpus": list(s.gpus), "sleeps": s.sleeps} for s in slots],
        "starts": starts,
    }
