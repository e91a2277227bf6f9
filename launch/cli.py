"""The ``memrl`` command line.

Every job command takes ``--config FILE.yaml`` plus dotted overrides (``train.lr=1e-6``). Before anything is created
the config is validated and so is everything it names (data records, model and adapter paths, output folders:
launch/preflight.py plus the command's own checks); the run directory is created only when the run starts, and a
start that fails on bad input removes what it created. Expected failures (:class:`~memrl.data.errors.UserError`) print
one message with the fix and exit 2; so do faults of what a run stands on, met while it runs (a write the disk or the
file-size limit refuses, an endpoint that keeps failing after its retries: :class:`~memrl.data.errors.RunFault`), and
those keep what the run saved for ``--resume``. A traceback means a bug and comes with the log file's path (exit 1).
A closed stdin/stdout/stderr gets ``/dev/null`` and a deleted working folder is refused before anything loads.
Third-party output goes to the run's ``run.log`` unless ``--verbose``. Heavy imports happen only inside the command
that needs them, so ``memrl --help`` answers at once.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from memrl.data.config import ConfigError
from memrl.data.errors import RunFault, UserCodeError, UserError
from memrl.launch.jobs import JOBS, Job
from memrl.launch.model_commands import add_model_commands

__all__ = ["main"]


def _add_job_arguments(parser: argparse.ArgumentParser, job: Job) -> None:
    parser.add_argument("--config", help="YAML config file (omit to use the defaults)")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show third-party warnings and engine logs on the console (always in run.log)",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. train.lr=1e-6")
    if job.resumable:
        parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
        parser.add_argument(
            "--allow-config-change",
            nargs="+",
            metavar="KEY",
            default=None,
            help="with --resume: config keys (or sections) that may differ from the run's saved "
            "config (sets run.allow_config_change)",
        )
    for flag, key, help_text in job.flags:
        parser.add_argument(flag, dest=f"flag:{key}", metavar="VALUE", help=f"{help_text} (sets {key})")
    if job.dry_run:
        parser.add_argument("--dry-run", action="store_true", help="print the files and endpoints it needs and stop")


def _run_job(job: Job, args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if getattr(args, "resume", False):
        overrides.append("run.resume=true")
    allowed = getattr(args, "allow_config_change", None)
    if allowed:
        if not getattr(args, "resume", False):
            raise ConfigError("--allow-config-change applies to --resume only (a new run has no saved config)")
        overrides.append(f"run.allow_config_change={json.dumps(allowed)}")
    for _, key, _ in job.flags:
        value = getattr(args, f"flag:{key}", None)
        if value is not None:
            overrides.append(f"{key}={value}")
    config = job.load_config(args.config, overrides)
    if getattr(args, "dry_run", False):
        # a dry run reports what is missing, so it runs before the checks that would stop at the first missing file
        return int(job.load("dry_run")(config) or 0)
    from memrl.launch.preflight import check_config

    check_config(config)
    if job.checks:
        job.load("checks")(config)
    run = getattr(config, "run", None)
    from memrl.data.run_dir import unlock_run_dirs
    from memrl.data.tracking import run_log_path
    from memrl.data.user_code import user_fault

    try:
        with _created_only_on_success(Path(run.output_dir) if run is not None else None):
            from memrl.launch.console import console

            with console(verbose=bool(args.verbose or os.environ.get("MEMRL_VERBOSE"))):
                try:
                    code = job.load("runner")(config)
                except UserCodeError as exc:
                    exc.run_log = run_log_path()  # type: ignore[attr-defined] # kept when the run folder stays
                    raise
                except (UserError, KeyboardInterrupt):
                    raise
                except Exception as exc:
                    fault = _runtime_fault(exc, Path(run.output_dir) if run is not None else Path("."))
                    if fault is not None:
                        raise fault from exc
                    theirs = user_fault(exc)  # an exception raised inside the user's own component
                    if theirs is not None:
                        theirs.run_log = run_log_path()  # type: ignore[attr-defined]
                        raise theirs from exc
                    raise _Bug(exc, _save_traceback()) from exc
    finally:
        unlock_run_dirs()
    return int(code or 0)


def _runtime_fault(exc: Exception, output_dir: Path) -> UserError | None:
    """The one-line error for an exception that is a fault of the run's surroundings, not a bug: a write the storage
    refused (the file it names, else the output folder), an OpenAI-compatible endpoint that kept failing after its
    retries. None for anything else."""
    from memrl.data.io import storage_error

    target = output_dir
    for cause in (exc, exc.__cause__, exc.__context__):
        name = getattr(cause, "filename", None)
        if isinstance(cause, OSError) and isinstance(name, str) and name:
            target = Path(name)
            break
    return storage_error(exc, target, "the run stopped")


class _Bug(Exception):
    """An unexpected exception (a bug), with the file its traceback was saved to."""

    def __init__(self, error: BaseException, log: Path) -> None:
        super().__init__(str(error))
        self.error, self.log = error, log


def _save_traceback() -> Path:
    """Append the current traceback to the run's log (a temporary file when the run has none yet)."""
    from memrl.data.tracking import run_log_path

    return _save_text(traceback.format_exc(), run_log_path())


def _save_text(text: str, path: Path | None) -> Path:
    """Append ``text`` to ``path`` (a temporary file when it is None or its folder is gone); where it went."""
    fallback = Path(tempfile.gettempdir()) / f"memrl-crash-{datetime.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.log"
    if path is None or not path.parent.is_dir() or path.parent == Path(tempfile.gettempdir()):
        path = fallback
    for candidate in dict.fromkeys((path, fallback)):
        try:
            with open(candidate, "a", encoding="utf-8") as fh:
                fh.write(text)
            return candidate
        except OSError:  # the run's disk is full or gone: try the next place
            continue
    sys.__stderr__.write(text)
    return Path("<stderr>")


def _keep_run_log(exc: UserError, run_dir: Path) -> None:
    """A run stopped by the user's own code keeps its log (the tracebacks of the episodes it failed) in the temporary
    folder when its run folder is removed; the error's ``run_log`` says where."""
    log = run_dir / "run.log"
    if isinstance(exc, UserCodeError) and log.is_file():
        kept = Path(tempfile.gettempdir()) / f"memrl-{run_dir.name}-{datetime.datetime.now():%Y%m%d-%H%M%S}-run.log"
        with contextlib.suppress(OSError):
            shutil.move(log, kept)
            exc.run_log = kept  # type: ignore[attr-defined]


def _user_log(exc: UserCodeError) -> str:
    """Append the user's whole traceback to the run's log (a temporary file when the run has none or it was
    removed); the line saying where it is."""
    log = getattr(exc, "run_log", None)
    if log is not None and not Path(log).is_file():
        log = None
    if exc.details:
        try:
            if log is None:
                raise OSError
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(exc.details)
        except OSError:
            log = _save_text(exc.details, None)
        return f"\nthe whole traceback is in {log}"
    return f"\nthe run's log is in {log}" if log is not None else ""


def _has_complete_checkpoint(folder: Path) -> bool:
    return any(folder.rglob("COMPLETE")) or any(folder.rglob("trainer_state.json"))


@contextlib.contextmanager
def _created_only_on_success(output_dir: Path | None) -> Iterator[None]:
    """On a failed start (a :class:`UserError` from the runner) remove the run folder this process created (and
    locked), unless it already holds a complete checkpoint, and the parents of ``output_dir`` it created, when they
    are empty. Nothing another process wrote is touched: a folder this process did not create is left as it is."""
    if output_dir is None:
        yield
        return
    top = output_dir.absolute()
    while not top.parent.exists() and top != top.parent:
        top = top.parent
    missing = [] if top.exists() else [output_dir.absolute(), *output_dir.absolute().parents]
    missing = [p for p in missing if p == top or top in p.parents]
    try:
        yield
    except RunFault:
        raise  # the run had started: what it saved stays for --resume
    except UserError as exc:
        from memrl.data.run_dir import created_run_dirs, unlock_run_dirs

        for run_dir in created_run_dirs():
            if not _has_complete_checkpoint(run_dir):
                unlock_run_dirs(run_dir)
                _keep_run_log(exc, run_dir)
                shutil.rmtree(run_dir, ignore_errors=True)
        for folder in missing:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
        raise


def _config_show(args: argparse.Namespace) -> int:
    """Print the resolved config of a YAML file (its ``command`` key picks the schema)."""

    from memrl.data.config import config_to_yaml, read_config_yaml

    by_name = {" ".join(j.path): j for j in JOBS}
    command = args.command
    if command is None and args.config:
        loaded = read_config_yaml(Path(args.config))[0] or {}
        command = loaded.get("command") if isinstance(loaded, dict) else None
    if command is None:
        raise ConfigError(f"cannot tell which command the config is for: give --command (one of {sorted(by_name)})")
    if command not in by_name:
        raise ConfigError(f"unknown command {command!r}; one of {sorted(by_name)}")
    config = by_name[command].load_config(args.config, args.overrides)
    sys.stdout.write(config_to_yaml(config))
    return 0


def _model_tiny(args: argparse.Namespace) -> int:
    """Write a tiny random-initialised Qwen3 model and its offline tokenizer."""
    from memrl.data.checks import check_output_dir
    from memrl.rollout.models import TinyModelSpec, build_tiny_model

    check_output_dir(args.out, "--out")
    from pydantic import ValidationError

    from memrl.data.io import describe_validation_error
    from memrl.launch.preflight import check_config

    fields = {k: v for k, v in vars(args).items() if k in TinyModelSpec.model_fields and v is not None}
    try:
        spec = TinyModelSpec(**fields)
    except ValidationError as exc:
        raise ConfigError(f"memrl model tiny: {describe_validation_error(exc)}") from None
    check_config(spec)
    out = build_tiny_model(args.out, spec)
    print(f"tiny model written to {out} ({spec.layers} layers x {spec.hidden} hidden, vocab {spec.vocab_size})")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from memrl.launch.plan import run_plan

    return run_plan(args)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (only commands that work are listed)."""
    parser = argparse.ArgumentParser(prog="memrl", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", required=True)
    groups: dict[tuple[str, ...], Any] = {(): sub}
    for job in JOBS:
        for depth in range(1, len(job.path)):
            key = job.path[:depth]
            if key not in groups:
                grp = groups[key[:-1]].add_parser(key[-1], help=f"{key[-1]} commands")
                groups[key] = grp.add_subparsers(dest=f"cmd_{depth}", metavar="COMMAND", required=True)
        p = groups[job.path[:-1]].add_parser(job.path[-1], help=job.help, description=job.help)
        _add_job_arguments(p, job)
        p.set_defaults(handler=lambda a, j=job: _run_job(j, a))

    cfg = sub.add_parser("config", help="inspect configs").add_subparsers(
        dest="cfg_cmd", metavar="COMMAND", required=True
    )
    show = cfg.add_parser("show", help="print the resolved config (defaults + file + overrides)")
    show.add_argument("--config", help="YAML config file")
    show.add_argument("--command", help="which command's schema (default: the file's `command` key)")
    show.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    show.set_defaults(handler=_config_show)

    model = sub.add_parser("model", help="model utilities").add_subparsers(
        dest="model_cmd", metavar="COMMAND", required=True
    )
    tiny = model.add_parser("tiny", help="write a tiny random-initialised Qwen3 model + offline tokenizer")
    tiny.add_argument("--out", required=True, help="output directory")
    for name, kind in (
        ("seed", int),
        ("layers", int),
        ("hidden", int),
        ("head-dim", int),
        ("kv-heads", int),
        ("intermediate", int),
        ("vocab-size", int),
        ("max-position", int),
        ("tokenizer-seed", int),
    ):
        tiny.add_argument(f"--{name}", type=kind, dest=name.replace("-", "_"))
    tiny.set_defaults(handler=_model_tiny)
    add_model_commands(model)

    plan = sub.add_parser(
        "plan",
        help="estimate per-rank GPU memory of a GRPO recipe before launch",
        description="per-rank trainer and policy-engine GPU memory of a GRPO recipe; exit 1 if it "
        "cannot fit (launch/plan.py)",
    )
    plan.add_argument("--config", required=True, help="the recipe (train oat-grpo or train pivot-grpo YAML)")
    plan.add_argument("--nodes", type=int, default=1)
    plan.add_argument("--gpus-per-node", type=int, default=8)
    plan.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU (default: A100-80GB)")
    plan.add_argument("--reserve-gib", type=float, default=2.0, help="CUDA context, NCCL buffers, fragmentation")
    plan.add_argument("--model-config", help="the policy's config.json (default: the base's own, else assumed)")
    plan.add_argument("--json", action="store_true", help="also print the plan as one JSON line")
    plan.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    plan.set_defaults(handler=_plan)
    return parser


def _standard_streams() -> None:
    """Give a closed stdin, stdout or stderr (``memrl ... >&-``) ``/dev/null``: otherwise the next file opened takes
    its descriptor, and what the command prints (or the run log's redirection of descriptors 1 and 2) lands in it."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDONLY if mode == "r" else os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        setattr(sys, name, open(fd, mode, closefd=False, encoding="utf-8"))  # noqa: SIM115 - the process's stream


def _own_words(exc: BaseException) -> str:
    """An expected error's message; one raised in a Ray worker (a rollout worker's endpoint that kept failing) comes
    back as Ray's ``RayTaskError(<the error>)``, whose text is the worker's traceback: its cause's message instead."""
    cause = getattr(exc, "cause", None)
    if type(exc).__name__.startswith("RayTaskError") and isinstance(cause, UserError):
        return str(cause)
    return str(exc)


def _say(text: str) -> None:
    """The command's last word on stderr, on a line of its own: progress bars a failure left open are closed first
    (nothing when stderr has gone: a closed pipe)."""
    tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
    for bar in list(getattr(tqdm, "_instances", None) or ()):
        with contextlib.suppress(Exception):
            bar.close()
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memrl`` console script."""
    _standard_streams()
    try:
        os.getcwd()
    except OSError as exc:  # torch and its libraries cannot even load then (oneMKL: "Cannot load libtorch_cpu.so")
        _say(
            f"memrl: error: the working folder no longer exists ({exc.strerror}): cd into an existing folder and run "
            "the command again"
        )
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    from memrl.launch.shutdown import handle_signals

    try:
        with handle_signals():  # SIGTERM ends every command as Ctrl-C does (launch/shutdown.py)
            code = handler(args)
    except UserCodeError as exc:
        cause = getattr(exc, "cause", None)  # raised in a Ray rollout worker: Ray's wrapper around it
        own = cause if type(exc).__name__.startswith("RayTaskError") and isinstance(cause, UserCodeError) else exc
        own.run_log = getattr(exc, "run_log", None)  # type: ignore[attr-defined]
        _say(f"memrl: error: {own}" + (f"\n{own.frames}" if own.frames else "") + _user_log(own))
        return 2
    except ConfigError as exc:
        _say(f"memrl: config error: {_own_words(exc)}")
        return 2
    except RunFault as exc:
        resumable = getattr(args, "resume", None) is not None
        _say(
            f"memrl: error: {_own_words(exc)}"
            + ("; what the run saved is kept: continue it with --resume" if resumable else "")
        )
        return 2
    except UserError as exc:
        _say(f"memrl: error: {_own_words(exc)}")
        return 2
    except _Bug as bug:
        _say(
            f"memrl: unexpected error (a bug, please report it): {type(bug.error).__name__}: {bug.error}\n"
            f"the traceback is in {bug.log}"
        )
        return 1
    except KeyboardInterrupt as interrupt:
        from memrl.launch.shutdown import exit_code, stop_children

        stop_children()
        code = exit_code(interrupt)
        what = {143: "terminated (SIGTERM)", 129: "hung up (SIGHUP)"}.get(code, "interrupted (SIGINT)")
        resumable = getattr(args, "resume", None) is not None
        _say(
            f"memrl: {what}: stopped"
            + ("; what it saved is kept (checkpoints are written whole): continue with --resume" if resumable else "")
        )
        return code
    _leave_process_group()
    return code


def _leave_process_group() -> None:
    """At the end of a distributed run every rank leaves the process group together: a rank that exits while another
    is still inside gloo or NCCL can abort it in teardown ("terminate called without an active exception"), and
    PyTorch warns about a group that was never destroyed. Commands that never imported torch skip this."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
