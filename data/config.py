"""Typed configuration: pydantic models loaded from YAML with dotted command-line overrides.

Every section of every command is a :class:`ConfigModel` (unknown keys are errors). :func:`load_config` reads a YAML
file, applies ``a.b.c=value`` overrides and validates; any problem raises :class:`ConfigError` naming the key, the
file (with its line when known) and the closest valid key.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.resources
import json
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from memrl.data.errors import UserError

__all__ = [
    "ConfigError",
    "ConfigModel",
    "EndpointURL",
    "FieldError",
    "LoggingConfig",
    "PlacementConfig",
    "PolicyPlacement",
    "RunConfig",
    "ServedModel",
    "WandbConfig",
    "apply_overrides",
    "check_endpoint_url",
    "config_hash",
    "config_to_yaml",
    "load_config",
    "resolve_deepspeed_config",
    "write_resolved_config",
]

C = TypeVar("C", bound="ConfigModel")


class ConfigError(UserError, ValueError):
    """A configuration problem, reported before any work starts."""


class FieldError(ValueError):
    """A field's error found by a model-level validator (reported at the field's own key)."""

    def __init__(self, field: str, value: Any, message: str) -> None:
        super().__init__(message)
        self.field, self.value = field, value


class ConfigModel(BaseModel):
    """Base class of every config section: unknown keys are rejected, assignments are validated, numbers are finite
    (``nan`` / ``inf`` are errors) and a boolean is not a number (``iterations: true`` is an error, not 1). Ranges
    are declared on the fields themselves (``Field(gt=0, le=...)``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)
    # keys this section no longer has -> where their setting lives now (the error names it, never a silent default)
    renamed_keys: ClassVar[dict[str, str]] = {}
    # named settings a section may be given as a string instead of its keys (the section's own validator expands
    # them; overrides of single keys apply on top of the named setting)
    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                if isinstance(name, str) and name in cls.renamed_keys:
                    raise FieldError(name, value, f"this key was renamed: {cls.renamed_keys[name]}")
        return data

    @model_validator(mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if isinstance(value, bool) and field is not None:
                    kinds = _unwrap(field.annotation)
                    if bool not in kinds and any(k in (int, float) for k in kinds):
                        raise FieldError(name, value, "expected a number, got a boolean")
        return data


def check_endpoint_url(url: str) -> str:
    """An OpenAI-compatible endpoint's base URL: ``http(s)://host[:port][/path]``; anything else is a ValueError
    saying what is wrong (``htp:/nope`` is not accepted)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"endpoint {url!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or (port is not None and not 0 < port < 65536):
        raise ValueError(f"endpoint {url!r} is not an http(s)://host[:port]/v1 URL")
    return url


EndpointURL = Annotated[str, AfterValidator(check_endpoint_url)]
"""An OpenAI-compatible endpoint's base URL (checked by :func:`check_endpoint_url`)."""


def check_regex(pattern: str) -> str:
    """A pattern Python's ``re`` compiles; anything else is a ValueError quoting the regex engine's complaint."""
    import re

    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return pattern


RegexPattern = Annotated[str, AfterValidator(check_regex)]
"""A regular expression, checked when the config loads (the error names the field)."""


class WandbConfig(ConfigModel):
    """Weights & Biases logging. ``mode: offline`` works without a network; keys come from the environment only."""

    enabled: bool = False  # log metrics to wandb (the same as listing wandb in run.logging.backends)
    project: str = "memrl"  # wandb project
    entity: str | None = None  # wandb team or user; None: your default
    mode: typing.Literal["online", "offline", "disabled"] = "offline"  # wandb mode; disabled logs nothing to wandb
    tags: list[str] = []  # wandb run tags


class LoggingConfig(ConfigModel):
    """Where a run's metrics go besides the console: ``metrics.jsonl`` always, and every backend listed
    (tensorboard and mlflow need the ``tracking`` extra: ``pip install 'memrl[tracking]'``)."""

    backends: list[typing.Literal["jsonl", "wandb", "tensorboard", "mlflow"]] = ["jsonl"]  # jsonl is always on
    tensorboard_dir: str | None = None  # TensorBoard event files; None: <run dir>/tensorboard
    mlflow_tracking_uri: str | None = None  # MLflow tracking store; None: a local file store, <run dir>/mlruns
    mlflow_experiment: str = Field("memrl", min_length=1)  # MLflow experiment the run is logged under


MAX_RUN_NAME_BYTES = 200  # a file name takes 255 bytes; the rest is room for the names memrl derives from it


class RunConfig(ConfigModel):
    """Where a run writes its outputs, and its global seed."""

    output_dir: str = Field("runs", min_length=1)  # parent directory of the run directory
    name: str | None = None  # run directory name (one path component); None: <command>-<UTC timestamp>
    seed: int = Field(0, ge=0, lt=2**32)  # global RNG seed of the run (numpy takes seeds below 2^32)
    resume: bool = False  # reuse an existing run directory and continue from its latest checkpoint
    allow_config_change: list[str] = []  # keys (or sections) a --resume may change; other changes are errors
    wandb: WandbConfig = WandbConfig()  # wandb settings; wandb logs when enabled or listed in logging.backends
    logging: LoggingConfig = LoggingConfig()  # metric backends: jsonl (always), wandb, tensorboard, mlflow

    @field_validator("name")
    @classmethod
    def _one_path_component(cls, name: str | None) -> str | None:
        if name is not None and (name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name):
            raise ValueError(
                "run.name must be a single folder name (no '/', '..' or '.'): the run folder is run.output_dir/run.name"
            )
        if name is not None and any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise ValueError(
                "run.name must not hold control characters (a newline, a tab): it names a folder that "
                "logs and shells print"
            )
        if name is not None and len(name.encode("utf-8", "surrogateescape")) > MAX_RUN_NAME_BYTES:
            raise ValueError(
                f"run.name is {len(name.encode('utf-8', 'surrogateescape'))} bytes long; a folder name "
                f"takes at most {MAX_RUN_NAME_BYTES}"
            )
        return name


class ServedModel(ConfigModel):
    """A frozen model behind OpenAI-compatible endpoints; requests are spread over all of them (more = faster)."""

    model: str = Field(min_length=1)  # the name the servers answer to (vLLM's --served-model-name)
    endpoints: list[EndpointURL] = []  # base URLs ending in /v1, e.g. http://gpu01:8000/v1
    api_key_env: str | None = None  # environment variable holding the key; None for local vLLM servers


class PolicyPlacement(ConfigModel):
    """Where the trained policy's own vLLM engine runs during rollouts.

    The main process owns the one engine (rollouts run there). ``colocate``: its workers share node 0's GPUs
    0..TP-1 with the training ranks, and it sleeps while the trainer updates (``sleep_level`` 1 keeps the weights in
    CPU memory, 2 drops them; 0 never sleeps; GPU only). ``separate``: the last ``gpus_per_node`` GPUs of every
    training node are kept from training, and the engine runs on the first TP of node 0's.
    """

    mode: typing.Literal["colocate", "separate"] = "colocate"  # colocate: share the training GPUs; separate: own GPUs
    tensor_parallel_size: int = Field(1, ge=1)  # vLLM tensor-parallel size (TP) of the policy engine
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)  # fraction of each GPU's memory vLLM may take
    sleep_level: typing.Literal[0, 1, 2] = 1  # colocate: 0 never sleeps, 1 weights to CPU, 2 drop weights
    gpus_per_node: int = Field(0, ge=0)  # separate: GPUs per node kept for the engine; 0 with colocate

    @model_validator(mode="after")
    def _check_gpus(self) -> PolicyPlacement:
        if self.mode == "colocate" and self.gpus_per_node:
            raise ValueError("gpus_per_node applies to mode 'separate' only (colocated engines use the training GPUs)")
        if self.mode == "separate" and (self.gpus_per_node < 1 or self.gpus_per_node % self.tensor_parallel_size):
            raise ValueError(
                f"mode 'separate' needs gpus_per_node >= 1 and a multiple of tensor_parallel_size "
                f"({self.tensor_parallel_size}), got {self.gpus_per_node}"
            )
        return self


class PlacementConfig(ConfigModel):
    """Rollout placement: the policy engine, and the frozen reasoner / committee / judge servers (see docs/cluster.md).

    ``reasoner``, ``committee`` and ``judge`` unset mean the recipe's own engines; the Slurm script fills them with the
    endpoints of the servers it starts.
    """

    policy: PolicyPlacement = PolicyPlacement()
    reasoner: ServedModel | None = None
    committee: list[ServedModel] = []
    judge: ServedModel | None = None


# ----------------------------------------------------------------------------------------------------------------
# YAML: data only (no tags, no duplicate keys, few aliases), with line numbers

MAX_YAML_ALIASES = 100  # a config needs a few anchors at most
MAX_YAML_NODES = 200_000  # values once aliases are expanded: an "alias bomb" of a few lines expands to billions
MAX_CONFIG_BYTES = 1 << 20  # a config file (the shipped recipes are a few KB); data belongs in data files
MAX_LIST_ITEMS = 10_000  # items of one list (or keys of one mapping) in a resolved config


class _LineLoader(yaml.SafeLoader):
    """SafeLoader for config files: a duplicate key, a ``!!python/...`` (or any non-standard) tag and more than
    :data:`MAX_YAML_ALIASES` aliases are errors at their line instead of a silent last value, a traceback or a hang."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"more than {MAX_YAML_ALIASES} aliases (*name): refused (an alias bomb?)",
                    self.peek_event().start_mark,
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = key_node.value
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {seen[key]})", key_node.start_mark
                    )
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many values ``node`` holds once every alias is expanded (shared nodes counted once per use)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = MAX_YAML_NODES + 1  # a node that contains itself never ends when expanded
    size = 1
    if isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, memo) for item in node.value)
    memo[id(node)] = size
    return size


def _refuse_tag(loader: _LineLoader, suffix: str, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, f"tag {node.tag!r} refused: config files hold plain data", node.start_mark
    )


_LineLoader.add_multi_constructor("!", _refuse_tag)
_LineLoader.add_multi_constructor("tag:yaml.org,2002:python/", _refuse_tag)


def shipped_configs() -> Path:
    """The folder of the recipes memrl ships (``memrl.configs``), in a source checkout and an installed wheel alike."""
    return Path(str(importlib.resources.files("memrl.configs")))


def config_file(name_or_path: str | Path) -> Path:
    """A config file by path, or a shipped recipe by name (``oat_grpo_tiny`` or ``oat_grpo_tiny.yaml``).

    A path that exists wins; a bare name (no folder) falls back to the shipped recipes. Anything else is a
    :class:`ConfigError` naming what was looked for.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.parent == Path(".") and not path.exists():
        shipped = shipped_configs()
        for candidate in (shipped / path.name, shipped / f"{path.name}.yaml"):
            if candidate.is_file():
                return candidate
        names = sorted(p.stem for p in shipped.glob("*.yaml"))
        raise ConfigError(f"config file not found: {path} (not a file here, nor a shipped recipe: {', '.join(names)})")
    raise ConfigError(f"config file not found: {path}")


def read_config_yaml(file: Path) -> tuple[Any, dict[str, int]]:
    """A config file's YAML (a path, or a shipped recipe's name) and the line of every key; a missing file, non-UTF-8
    text or invalid YAML is a :class:`ConfigError` naming the file (and the line)."""
    file = config_file(file)
    size = file.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{file}: a config file of {size:,} bytes (at most {MAX_CONFIG_BYTES:,}): refused before "
            "reading it; is this the file you meant? Data (episodes, tasks) belongs in data files that "
            "the config names"
        )
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return _load_yaml_with_lines(text, str(file))


def _load_yaml_with_lines(text: str, source: str) -> tuple[Any, dict[str, int]]:
    try:
        node = yaml.compose(text, Loader=_LineLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError(f"{where}: invalid YAML: {exc.problem}") from None
    if node is not None and (size := _expanded_size(node, {})) > MAX_YAML_NODES:
        raise ConfigError(
            f"{source}: invalid YAML: its aliases expand to {size:,} values (more than "
            f"{MAX_YAML_NODES:,}): refused (an alias bomb?)"
        )
    lines: dict[str, int] = {}

    def walk(n: yaml.Node, prefix: str) -> None:
        if isinstance(n, yaml.MappingNode):
            for key_node, value_node in n.value:
                key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key)
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                key = f"{prefix}.{i}"
                lines[key] = item.start_mark.line + 1
                walk(item, key)

    if node is not None:
        walk(node, "")
    try:
        data = yaml.load(text, Loader=_LineLoader)  # a SafeLoader refusing every tag
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError(f"{where}: invalid YAML: {exc.problem}") from None
    return data, lines


# ----------------------------------------------------------------------------------------------------------------
# Introspection: which model lives at a dotted path, for suggestions


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types inside Optional/Union/Annotated/list/dict annotations."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for arg in get_args(annotation):
            out.extend(_unwrap(arg))
        return out
    return [annotation]


def _field_target(annotation: Any) -> tuple[str, type[BaseModel] | None]:
    """('model', M) for a model field, ('container', M) for a list/dict of models, else ('', None)."""
    for candidate in _unwrap(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return "model", candidate
        if get_origin(candidate) in (list, tuple, dict, Sequence, typing.Mapping) and get_args(candidate):
            for inner in _unwrap(get_args(candidate)[-1]):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    return "container", inner
    return "", None


def _model_at(cls: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class reached by following a pydantic location from ``cls`` (list indices and dict keys skipped)."""
    current: type[BaseModel] = cls
    in_container = False
    for part in loc:
        if in_container:  # this part is an index or key into a list/dict of models
            in_container = False
            continue
        if not isinstance(part, str) or part not in current.model_fields:
            return None
        kind, target = _field_target(current.model_fields[part].annotation)
        if target is None:
            return None
        current, in_container = target, kind == "container"
    return None if in_container else current


def _suggest(prefix: str, key: str, candidates: Sequence[str], model: type[BaseModel] | None = None) -> str:
    """'; did you mean 'prefix.close_key'?' (or 'prefix.section.key' when ``key`` is a key of one of ``model``'s
    sections, e.g. ``logging`` -> ``run.logging``), else the list of valid keys at that level."""
    lead = prefix + "." if prefix else ""
    match = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    if match:
        return f"; did you mean '{lead}{match[0]}'?"
    for name in candidates if model is not None else ():
        section = _model_at(model, [name])
        if section is not None and key in section.model_fields:
            return f"; did you mean '{lead}{name}.{key}'?"
    return f"; valid keys here: {', '.join(sorted(candidates))}"


# ----------------------------------------------------------------------------------------------------------------
# Overrides


def _parse_override_value(raw: str) -> Any:
    if raw == "":
        return ""
    try:
        return yaml.load(raw, Loader=_LineLoader)  # a SafeLoader refusing every tag
    except yaml.constructor.ConstructorError as exc:
        raise ConfigError(f"override value {raw!r}: {exc.problem}") from None
    except yaml.YAMLError:
        return raw


def apply_overrides(cls: type[BaseModel], data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict, checking every key against ``cls``'s fields."""
    data = dict(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}': expected KEY=VALUE (for example train.lr=1e-6)")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override '{item}': empty key component")
        model: type[BaseModel] | None = cls
        node = data
        for depth, part in enumerate(parts):
            if (
                model is not None
                and part not in model.model_fields
                and issubclass(model, ConfigModel)
                and (part in model.renamed_keys)
            ):
                raise ConfigError(f"override '{item}': key '{key}' was renamed: {model.renamed_keys[part]}")
            if model is not None and part not in model.model_fields:
                hint = _suggest(".".join(parts[:depth]), part, list(model.model_fields), model)
                raise ConfigError(f"override '{item}': unknown key '{key}'{hint}")
            if depth == len(parts) - 1:
                node[part] = _parse_override_value(raw)
            else:
                child = node.get(part)
                sub = _model_at(model, [part]) if model is not None else None
                if isinstance(child, str) and sub is not None and issubclass(sub, ConfigModel) and child in sub.presets:
                    child = sub.presets[child]  # a named setting, then the override's key on top of it
                child = dict(child) if isinstance(child, dict) else {}
                node[part] = child
                node = child
                model = sub
    return data


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _format_validation_error(
    cls: type[BaseModel], exc: ValidationError, source: str, lines: dict[str, int], override_keys: set[str]
) -> str:
    messages = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        if isinstance(field_error := err.get("ctx", {}).get("error"), FieldError):
            loc = [*loc, field_error.field]
            err = {**err, "input": field_error.value, "msg": str(field_error)}
        dotted = ".".join(str(p) for p in loc)
        if dotted in override_keys:
            where = "command-line override"
        else:
            line = lines.get(dotted)
            where = f"{source}:{line}" if line else source
        if err["type"] == "extra_forbidden":
            parent = _model_at(cls, loc[:-1])
            fields = list(parent.model_fields) if parent is not None else []
            prefix = ".".join(str(p) for p in loc[:-1])
            hint = _suggest(prefix, str(loc[-1]), fields, parent) if fields else ""
            messages.append(f"{where}: unknown key '{dotted}'{hint}")
        elif err["type"] == "missing":
            messages.append(f"{where}: missing required value '{dotted}'")
        else:
            value = err.get("input")
            shown = repr(value)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            messages.append(f"{where}: key '{dotted}': {err['msg']} (got {shown})")
    return "invalid configuration:\n  " + "\n  ".join(messages)


def load_config(
    cls: type[C], path: str | Path | None = None, overrides: Sequence[str] = (), defaults: dict[str, Any] | None = None
) -> C:
    """Load ``cls`` from an optional YAML file plus dotted overrides; raise :class:`ConfigError` on any problem."""
    data: dict[str, Any] = dict(defaults or {})
    lines: dict[str, int] = {}
    source = "<defaults>"
    if path is not None:
        file = config_file(path)
        source = str(file)
        loaded, lines = read_config_yaml(file)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{file}: the top level must be a mapping of keys, got {type(loaded).__name__}")
        data = _deep_merge(data, loaded)
    data = apply_overrides(cls, data, overrides)
    override_keys = {o.split("=", 1)[0].strip() for o in overrides}
    _check_sizes(data, "", source, lines, override_keys)
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(cls, exc, source, lines, override_keys)) from None


def _check_sizes(node: Any, key: str, source: str, lines: dict[str, int], override_keys: set[str]) -> int:
    """Refuse a list (or mapping) of more than :data:`MAX_LIST_ITEMS` items, and a config of more than
    :data:`MAX_YAML_NODES` values in all, naming the key, before validation walks it; returns the values counted."""
    if not isinstance(node, (list, dict)):
        return 1
    if len(node) > MAX_LIST_ITEMS:
        where = (
            "command-line override" if key in override_keys else f"{source}:{lines[key]}" if key in lines else source
        )
        kind = "list" if isinstance(node, list) else "mapping"
        raise ConfigError(
            f"{where}: key '{key or '<top level>'}' is a {kind} of {len(node):,} items (at most "
            f"{MAX_LIST_ITEMS:,}): refused; is it the value you meant?"
        )
    items = node.items() if isinstance(node, dict) else enumerate(node)
    total = 1
    for name, value in items:
        total += _check_sizes(value, f"{key}.{name}" if key else str(name), source, lines, override_keys)
        if total > MAX_YAML_NODES:
            raise ConfigError(f"{source}: the config holds more than {MAX_YAML_NODES:,} values: refused")
    return total


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def config_to_yaml(cfg: BaseModel) -> str:
    """The resolved config as YAML text (every default made explicit)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def config_hash(cfg: BaseModel) -> str:
    """A short stable hash of the resolved config (identifies what produced an artefact)."""
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_resolved_config(cfg: BaseModel, run_dir: str | Path, name: str = "config.yaml") -> Path:
    """Write the resolved config into ``run_dir`` atomically and return its path."""
    from memrl.data.io import atomic_write_text

    out = Path(run_dir) / name
    atomic_write_text(out, config_to_yaml(cfg))
    return out


def resolve_deepspeed_config(name_or_path: str) -> Path:
    """The DeepSpeed JSON a recipe names: a file path, or a name under ``configs/deepspeed/`` (``zero2``, ...)."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.parent != Path("."):
        if not path.is_file():
            raise ConfigError(f"DeepSpeed config file not found: {path}")
        return path
    folder = shipped_configs() / "deepspeed"
    named = folder / f"{name_or_path}.json"
    if not named.is_file():
        known = sorted(p.stem for p in folder.glob("*.json"))
        raise ConfigError(f"unknown DeepSpeed config {name_or_path!r}; one of {known} or a path to a .json file")
    return named
