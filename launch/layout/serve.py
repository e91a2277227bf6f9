"""``launch/serve_endpoints.sh``: vLLM OpenAI-compatible servers for the frozen reasoner, committee and judge
(:func:`plan_serve`)."""

from __future__ import annotations

import argparse
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from memrl.data.config import (
    ConfigModel,
)
from memrl.launch.layout.common import (
    VLLM_SERVER_MODULE,
    Plan,
    add_device_argument,
    help_plan,
    launcher_parser,
    shell_command,
    text_table,
)
from memrl.launch.layout.hosts import (
    Device,
    LaunchError,
    gpus_on_node,
    resolve_device,
)


class ServeSpec(ConfigModel):
    """A served frozen model, parsed from ``MODEL[,key=value...]`` (keys: the fields below but ``model``).

    Every node runs ``replicas`` servers (default: as many as fit, GPUs // tp) on consecutive ports.
    """

    model: str
    name: str | None = None
    nodes: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    replicas: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(32768, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)

    @classmethod
    def parse(cls, text: str) -> ServeSpec:
        """Parse the comma-separated spec string."""
        model, *pairs = [p.strip() for p in text.split(",")]
        if not model or "=" in model:
            raise LaunchError(f"serve spec {text!r}: it starts with the model id, e.g. Qwen/Qwen3.5-35B-A3B,tp=2")
        fields: dict[str, Any] = {"model": model}
        for pair in pairs:
            if "=" not in pair:
                raise LaunchError(f"serve spec {text!r}: expected key=value, got {pair!r}")
            key, value = pair.split("=", 1)
            if key not in cls.model_fields or key == "model":
                keys = ", ".join(list(cls.model_fields)[1:])
                raise LaunchError(f"serve spec {text!r}: unknown key {key!r}; keys: {keys}")
            fields[key] = None if value.lower() == "none" else value
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise LaunchError(f"serve spec {text!r}: {exc}") from None

    @property
    def served_name(self) -> str:
        """The model name clients send (``--served-model-name``)."""
        return self.name or self.model

    def replicas_per_node(self, gpus: int, device: Device) -> int:
        """Servers per node: as configured, else as many as fit."""
        if device == "cpu":
            return self.replicas or 1
        fit = gpus // self.tp
        if fit < 1:
            raise LaunchError(f"{self.model}: TP {self.tp} needs {self.tp} GPUs per node, a node has {gpus}")
        if self.replicas is not None and self.replicas > fit:
            raise LaunchError(f"{self.model}: {self.replicas} replicas x TP {self.tp} need more than {gpus} GPUs")
        return self.replicas or fit


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def vllm_replicas(
    spec: ServeSpec, *, gpu_ids: list[str], device: Device, port: int, bind: str, extra: Sequence[str]
) -> list[tuple[dict[str, str], list[str], int]]:
    """(environment, command, port) of every server replica on one node."""
    count = spec.replicas_per_node(len(gpu_ids), device)
    out = []
    for i in range(count):
        cmd = [
            sys.executable, "-m", VLLM_SERVER_MODULE,
            "--model", spec.model,
            "--served-model-name", spec.served_name,
            "--host", bind,
            "--port", str(port + i),
            "--tensor-parallel-size", str(spec.tp if device == "gpu" else 1),
            "--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}",
        ]  # fmt: skip
        if spec.max_model_len is not None:
            cmd += ["--max-model-len", str(spec.max_model_len)]
        if device == "cpu":
            cmd += ["--dtype", "float32", "--enforce-eager"]
        cmd += list(extra)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(gpu_ids[i * spec.tp : (i + 1) * spec.tp])} if device == "gpu" else {}
        out.append((env, cmd, port + i))
    return out


def _serve_parser() -> argparse.ArgumentParser:
    parser = launcher_parser(
        "launch/serve_endpoints.sh run|start",
        "Start vLLM OpenAI-compatible servers for one frozen model on this node: REPLICAS servers of TP GPUs each on "
        "consecutive ports. Arguments after -- go to every vLLM server.",
    )
    parser.add_argument("--model", help="model id or directory (required)")
    parser.add_argument("--served-model-name", help="name clients send (default: the model)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per server (default 1)")
    parser.add_argument("--replicas", type=int, help="servers on this node (default: as many as fit)")
    parser.add_argument("--port", type=int, default=8000, help="port of the first server (default 8000)")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--advertise-host", help="host name clients use (default: this host's name)")
    parser.add_argument("--gpus", help="GPU ids to use (default: CUDA_VISIBLE_DEVICES or all visible GPUs)")
    parser.add_argument(
        "--max-model-len",
        help="context length per server, or 'none' for the model's own (default: 32768 on GPU, the model's own on CPU)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="fraction of memory vLLM reserves (default 0.9 on GPU, 0.15 of host memory on CPU)",
    )
    parser.add_argument("--log-dir", default="logs/serve", help="one log file per server (default logs/serve)")
    add_device_argument(parser)
    return parser


def plan_serve(argv: Sequence[str], env: Mapping[str, str]) -> Plan:
    """Plan ``launch/serve_endpoints.sh run [options] [-- vLLM args]`` on this node."""
    parser = _serve_parser()
    argv = list(argv)
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)
    if args.help:
        return help_plan(parser)
    if not args.model:
        raise LaunchError("--model is required")
    gpus = gpus_on_node(env)
    device = resolve_device(args.device, gpus)
    if args.gpus:
        gpu_ids = [g.strip() for g in args.gpus.split(",") if g.strip()]
    elif env.get("CUDA_VISIBLE_DEVICES") and device == "gpu":
        gpu_ids = [g.strip() for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    else:
        gpu_ids = [str(i) for i in range(gpus)]
    if args.max_model_len is None:
        max_len = 32768 if device == "gpu" else None
    else:
        max_len = None if args.max_model_len.lower() == "none" else int(args.max_model_len)
    util = args.gpu_memory_utilization or (0.9 if device == "gpu" else 0.15)
    try:
        spec = ServeSpec(
            model=args.model,
            name=args.served_model_name,
            tp=args.tp,
            replicas=args.replicas,
            max_model_len=max_len,
            gpu_memory_utilization=util,
        )
    except ValidationError as exc:
        raise LaunchError(str(exc)) from None
    replicas = vllm_replicas(spec, gpu_ids=gpu_ids, device=device, port=args.port, bind=args.host, extra=extra)
    host = socket.gethostname()
    advertise = args.advertise_host or ("127.0.0.1" if args.host in ("127.0.0.1", "localhost") else host)
    log_dir = Path(args.log_dir)
    logs = [str(log_dir / f"{_safe(spec.served_name)}-{_safe(host)}-{port}.log") for _, _, port in replicas]
    endpoints = [f"http://{advertise}:{port}/v1" for _, _, port in replicas]
    health = [f"http://127.0.0.1:{port}/health" for _, _, port in replicas]
    lines = [
        f"memrl serve: {spec.served_name} on {host}: {len(replicas)} server(s) x TP {spec.tp if device == 'gpu' else 1}"
        f" on {device.upper()}",
        *text_table(
            ["server", "GPUs", "port", "endpoint", "log"],
            [
                [i, env_.get("CUDA_VISIBLE_DEVICES", "-"), port, endpoints[i], logs[i]]
                for i, (env_, _, port) in enumerate(replicas)
            ],
        ),
        "commands:",
        *[f"  {shell_command(env_, cmd)}" for env_, cmd, _ in replicas],
    ]
    shell: dict[str, str | list[str]] = {
        "log_dir": str(log_dir),
        "replica_count": str(len(replicas)),
        "replica_logs": logs,
        "health_urls": health,
        "endpoints": endpoints,
    }
    for i, (env_, cmd, _) in enumerate(replicas):
        shell[f"replica_{i}"] = ["env", *(f"{k}={v}" for k, v in env_.items()), *cmd]
    info = {
        "model": spec.model,
        "served_model_name": spec.served_name,
        "device": device,
        "replicas": [{"env": e, "command": c, "port": p} for e, c, p in replicas],
        "endpoints": endpoints,
        "health_urls": health,
        "logs": logs,
    }
    return Plan(lines, shell, info, args.dry_run)
