"""Model layouts for the memory planner: the architecture numbers a memory estimate needs.

A `Layout` is read from a model directory's ``config.json`` (`Layout.from_hf_config`) or
named (`LAYOUTS`: the public Qwen3 dense checkpoints' numbers, from their ``config.json`` on
the Hugging Face hub, vocabulary 151,936), so a config written for a GPU cluster can be planned
on a machine without its weights. Parameter counts are exact for the decoder-only families
read here (Qwen3, Qwen2, Llama, Mistral): the embedding, per decoder layer the attention
projections (biases where ``attention_bias``), Qwen3's per-head q/k RMSNorm weights, the two
layer norms and the SwiGLU MLP, the final norm, and the output head unless tied to the embedding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# families whose parameter layout `Layout` counts exactly (model_type in config.json)
SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")
QWEN3_VOCAB = 151936


@dataclass(frozen=True)
class Layout:
    """A decoder-only transformer's shape (Hugging Face config field names in brackets).

    Attributes:
        name: the layout's name (a `LAYOUTS` key, or the model directory).
        hidden: h [hidden_size]; layers: L [num_hidden_layers]; heads: query heads
            [num_attention_heads]; kv_heads: key/value heads (GQA) [num_key_value_heads];
            head_dim: d [head_dim, else hidden / heads]; intermediate: I, the SwiGLU MLP width
            [intermediate_size]; vocab: V [vocab_size].
        tied: the output head shares the embedding matrix [tie_word_embeddings].
        qk_norm: per-head RMSNorm on queries and keys (Qwen3).
        attention_bias: q/k/v projections carry biases (Qwen2; o_proj too when the family does).
        o_bias: o_proj carries a bias.
    """

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qk_norm: bool = True
    attention_bias: bool = False
    o_bias: bool = False

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Each decoder layer's projections as ``name -> (in_features, out_features)``
        (the module names peft's ``target_modules`` match)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, self.intermediate),
            "up_proj": (h, self.intermediate),
            "down_proj": (self.intermediate, h),
        }

    def layer_params(self) -> int:
        """Parameters of one decoder layer (weights, biases, norms)."""
        n = sum(i * o for i, o in self.linear_shapes().values())
        if self.attention_bias:
            n += (self.heads + 2 * self.kv_heads) * self.head_dim
        if self.o_bias:
            n += self.hidden
        if self.qk_norm:
            n += 2 * self.head_dim
        return n + 2 * self.hidden  # input and post-attention RMSNorm

    def embedding_params(self) -> int:
        """The embedding matrix, plus the output head when untied (V x h each)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def params(self) -> int:
        """All parameters, shared (tied) ones once: ``sum(p.numel())`` of the loaded model."""
        return self.embedding_params() + self.layers * self.layer_params() + self.hidden  # + final norm

    def lora_params(self, r: int, target_modules: list[str]) -> int:
        """Trainable parameters of rank-`r` LoRA adapters on `target_modules` (peft semantics:
        a name matches every module whose name ends with it): ``r x (in + out)`` per adapted
        linear layer (A is r x in, B is out x r), ``r x (V + h)`` for an adapted embedding.

        Raises:
            ValueError: a target that names no module of this layout.
        """
        shapes = self.linear_shapes()
        head = {"lm_head": self.vocab + self.hidden, "embed_tokens": self.vocab + self.hidden}
        unknown = sorted(set(target_modules) - set(shapes) - set(head))
        if unknown:
            raise ValueError(f"LoRA target_modules {unknown} name no module of {self.name}; known: {[*shapes, *head]}")
        n = 0
        for t in dict.fromkeys(target_modules):
            n += r * (sum(shapes[t]) * self.layers if t in shapes else head[t])
        return n

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V cache one token occupies over all layers: 2 x L x kv_heads x d x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf_config(cls, cfg: dict, name: str) -> Layout:
        """The layout a Hugging Face ``config.json`` (as a dict) describes.

        Raises:
            ValueError: a model type whose parameters this module does not count, or a missing field.
        """
        kind = cfg.get("model_type")
        if kind not in SUPPORTED_MODEL_TYPES:
            known = ", ".join(SUPPORTED_MODEL_TYPES)
            raise ValueError(f"{name}: model_type {kind!r} is not one the planner counts ({known})")
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(
                name=name,
                hidden=hidden,
                layers=int(cfg["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate=int(cfg["intermediate_size"]),
                vocab=int(cfg["vocab_size"]),
                tied=bool(cfg.get("tie_word_embeddings", False)),  # every family's default
                qk_norm=kind == "qwen3",
                # Qwen2 always has q/k/v biases; the others only where the config says so
                attention_bias=kind == "qwen2" or bool(cfg.get("attention_bias", False)),
                o_bias=kind in ("llama", "mistral") and bool(cfg.get("attention_bias", False)),
            )
        except KeyError as e:
            raise ValueError(f"{name}: config.json has no {e.args[0]!r}") from None


def _qwen3(name: str, hidden: int, layers: int, heads: int, intermediate: int, tied: bool) -> Layout:
    return Layout(name, hidden, layers, heads, 8, 128, intermediate, QWEN3_VOCAB, tied)


# The public Qwen3 dense checkpoints (Qwen/Qwen3-*/config.json): 8 KV heads of 128 dims, q/k norm.
LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        _qwen3("qwen3-0.6b", 1024, 28, 16, 3072, tied=True),
        _qwen3("qwen3-1.7b", 2048, 28, 16, 6144, tied=True),
        _qwen3("qwen3-4b", 2560, 36, 32, 9728, tied=True),
        _qwen3("qwen3-8b", 4096, 36, 32, 12288, tied=False),
    )
}


def resolve_layout(model_path: str | Path | None, layout: str | None) -> Layout:
    """The architecture to plan: ``model_path/config.json`` when that file exists, else the
    named `layout`.

    Raises:
        ValueError: neither gives one (the message names both), or an unknown layout name.
    """
    if model_path:
        cfg_file = Path(model_path) / "config.json"
        if cfg_file.is_file():
            return Layout.from_hf_config(json.loads(cfg_file.read_text()), str(model_path))
    if layout is None:
        where = f"{Path(model_path) / 'config.json'} does not exist" if model_path else "no model_path is set"
        raise ValueError(
            f"no model architecture to plan: {where} and no layout is set "
            f"(set layout = one of {', '.join(LAYOUTS)}, or a model_path with a config.json)"
        )
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    return LAYOUTS[layout]
