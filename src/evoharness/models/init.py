"""Build, save and load Qwen3-architecture causal LMs.

`init_model` makes a fresh `Qwen3ForCausalLM` from a size preset and a
tokenizer and writes a standard Hugging Face model directory (config.json,
model.safetensors, generation_config.json, tokenizer files, chat template).
`load_model` / `load_tokenizer` read any local HF causal-LM directory (the
tiny CPU model or a real Qwen3-8B on GPU: the same code path). Nothing here
touches the model hub: paths must be local directories.

Attention is always SDPA: eager attention given a 4D boolean mask is
silently wrong (machine-notes.md), SDPA is right with any mask form.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.utils import logging as hf_logging

# transformers' per-load "Loading weights" / "Writing model shards" bars: cells and evaluations load
# models many times a run, and those bars drown the stages' own progress bars
hf_logging.disable_progress_bar()

# name -> Qwen3Config fields. Parameter counts are for a ~1k-2k vocabulary.
PRESETS: dict[str, dict] = {
    # ~1.8M params. 2-core CPU: ~3,700 train tok/s quiet (machine-notes.md), 1,400 under load
    # (benchmarks/results/bench_sft.txt); ~450-600 new tok/s decoding 16 x 300-token prompts.
    "tiny": dict(
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
    # ~1.1M params: 4 layers of tiny; ~1.8x tiny's train tok/s (5,000 on 1 thread): the CPU main job's default.
    "mini": dict(
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
    # ~10M params.
    "small": dict(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=10,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),
    # ~32M params.
    "base": dict(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
    ),
}
VOCAB_MULTIPLE = 64


def padded_vocab(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Round a tokenizer's length up to a multiple (embedding rows for matmul speed)."""
    return -(-n // multiple) * multiple


def make_config(
    preset: str | dict,
    tokenizer: PreTrainedTokenizerBase,
    max_position_embeddings: int = 4096,
    rope_theta: float = 10000.0,
    tie_word_embeddings: bool = True,
) -> Qwen3Config:
    """A `Qwen3Config` for a preset name (or a dict of Qwen3Config fields) and tokenizer.

    ``vocab_size`` is ``len(tokenizer)`` rounded up to a multiple of 64; the
    extra rows are never produced by the tokenizer and the engine masks them.

    Raises:
        KeyError: unknown preset name.
        ValueError: a field Qwen3Config does not have (it would be kept as a silent attribute).
    """
    fields = dict(PRESETS[preset]) if isinstance(preset, str) else dict(preset)
    if unknown := sorted(set(fields) - set(Qwen3Config().to_dict())):
        raise ValueError(f"not Qwen3Config fields: {unknown}")
    fields.setdefault("max_position_embeddings", max_position_embeddings)
    fields.setdefault("tie_word_embeddings", tie_word_embeddings)
    fields.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": rope_theta})
    return Qwen3Config(
        vocab_size=padded_vocab(len(tokenizer)),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **fields,
    )


def init_model(
    preset: str | dict,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path | None = None,
    seed: int = 0,
    **config_kwargs,
) -> Qwen3ForCausalLM:
    """A randomly initialised `Qwen3ForCausalLM` (fp32, CPU, eval mode).

    Args:
        preset: ``tiny`` / ``small`` / ``base`` or a dict of Qwen3Config fields.
        tokenizer: decides the vocabulary size and the pad/eos ids.
        out_dir: if given, the model and tokenizer are saved there (`save_model`).
        seed: the same seed gives bit-identical weights.
        config_kwargs: passed to `make_config`.
    """
    config = make_config(preset, tokenizer, **config_kwargs)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=128,
    )
    model.eval()
    if out_dir is not None:
        save_model(model, tokenizer, out_dir)
    return model


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, out_dir: str | Path) -> Path:
    """`save_pretrained` the model (safetensors) and tokenizer into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out


def _local_dir(path: str | Path, marker: str = "config.json") -> Path:
    p = Path(path)
    if not (p / marker).is_file():
        raise FileNotFoundError(f"{p} is not a local model directory (no {marker}); the model hub is never used")
    return p


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    """``None``/"auto" -> bf16 on CUDA, fp32 elsewhere (bf16 is 14-47x slower on these CPUs)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }[str(dtype)]


def load_model(
    path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None
) -> PreTrainedModel:
    """Load a local HF causal-LM directory for inference (eval mode, SDPA attention).

    Args:
        path: a directory with config.json and weights (any architecture
            `AutoModelForCausalLM` knows; e.g. the tiny model or Qwen3-8B).
        device: ``cpu``, ``cuda``, ``cuda:1``…; weights are placed there directly.
        dtype: torch dtype or name; default bf16 on CUDA, fp32 on CPU.

    Raises:
        FileNotFoundError: `path` is not a local model directory.
    """
    p = _local_dir(path)
    device = torch.device(device)
    # With `accelerate` installed, big checkpoints load straight onto the GPU;
    # without it (the CPU install), load on CPU and move.
    direct = device.type != "cpu" and importlib.util.find_spec("accelerate") is not None
    model = AutoModelForCausalLM.from_pretrained(
        str(p),
        dtype=resolve_dtype(dtype, device),
        attn_implementation="sdpa",
        local_files_only=True,
        **({"device_map": {"": device}} if direct else {}),
    )
    if not direct:
        model.to(device)
    model.eval()
    return model


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in a local directory (left padding; pad = eos if unset).

    Raises:
        FileNotFoundError: no tokenizer_config.json in `path`.
    """
    tok = AutoTokenizer.from_pretrained(str(_local_dir(path, "tokenizer_config.json")), local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def count_params(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
