"""LoRA adapters through peft (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

`apply_lora` injects peft ``LoraConfig`` adapters into a Hugging Face causal LM in place: each
targeted ``nn.Linear`` of weight ``W [out, in]`` computes ``W x + (alpha / r) * B A x`` with
``A [r, in]`` (random) and ``B [out, r]`` (zeros, so a fresh adapter changes nothing). Only A and
B require grad, so an optimizer built from ``requires_grad`` parameters (`train.trainer.Trainer`,
`train.sft.train_sft`) holds AdamW state for the adapters alone; the frozen base may stay in the
compute dtype (bf16 on GPUs) while the adapters are fp32 masters (peft's
``autocast_adapter_dtype``; `train.precision`).

The model the training code sees is the same Hugging Face model object, now with peft layers
inside (`LoRAModel.model`): ``get_decoder``, ``get_output_embeddings``, ``base_model`` and the
forward keep their meaning, so the losses need no LoRA case. The peft wrapper (`LoRAModel.peft`)
is kept for what only it does: disabling the adapters (the KL reference, `BaseReference`: the
same weights with the adapters off, no second copy of the model) and saving adapter files.

Files:
- an adapter directory (``LoRAModel.save_pretrained``): peft's ``adapter_config.json`` and
  ``adapter_model.safetensors`` (loadable by ``peft.PeftModel.from_pretrained``);
- an export (``LoRAModel.export``): a plain HF model directory with ``W + (alpha / r) B A`` merged
  into every adapted weight (loads with ``AutoModelForCausalLM.from_pretrained``, no peft), and the
  adapter directory in ``adapter/``;
- a weights sync (`runtime.cell.WeightStore`): the adapter tensors alone
  (`models.adapters.adapter_parameters`; an 8B model's r = 16 adapters on every projection are
  ~80 MB, the model 16 GB).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from evoharness.config.scale import LoRAConfig
from evoharness.models.adapters import adapter_parameters

ADAPTER_DIR = "adapter"  # an export's (and an RL checkpoint's) adapter directory


def apply_lora(model: Any, cfg: LoRAConfig, seed: int = 0, adapter_dir: str | Path | None = None) -> LoRAModel:
    """Inject `cfg`'s LoRA adapters into `model` (in place) and freeze everything else.

    Args:
        model: a Hugging Face causal LM (any dtype: the adapters are created fp32 over a bf16/fp16 base).
        cfg: rank, alpha, dropout, target module names (``r > 0``).
        seed: seeds the adapters' random init (``A``), so that every cell, rank or resumed process
            that builds the same model gets the same adapters; the global RNG is left as it was.
        adapter_dir: a saved adapter directory to load (a checkpoint's); None: fresh adapters.

    Returns:
        the `LoRAModel`; ``.model`` is `model` itself.

    Raises:
        ValueError: ``cfg.r == 0``; target names that match no module of `model` (named, with the
            model's linear layer names); a target on tied input/output embeddings; `adapter_dir`'s
            adapters not of this configuration (`LoRAModel.load_adapter`).
    """
    from peft import LoraConfig, get_peft_model

    if not cfg.enabled:
        raise ValueError("apply_lora needs lora.r > 0 (r = 0 is full fine-tuning)")
    _check_targets(model, cfg.target_modules)
    pcfg = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )
    gpus = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=gpus):  # manual_seed seeds every device: restore them all after
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, pcfg, autocast_adapter_dtype=True)
    lora = LoRAModel(peft_model)
    if adapter_dir is not None:
        lora.load_adapter(adapter_dir)
    return lora


class LoRAModel:
    """A causal LM with peft LoRA adapters (module docstring); build it with `apply_lora`.

    Attributes:
        peft: the ``peft.PeftModel`` wrapper (adapter files, disabling the adapters).
        model: the wrapped Hugging Face model (the object given to `apply_lora`), what trains and serves.
        cfg: the adapters' settings as peft holds them (``peft.LoraConfig``).
    """

    def __init__(self, peft_model: Any):
        self.peft = peft_model
        self.model = peft_model.get_base_model()
        self.cfg = peft_model.peft_config["default"]

    def reference(self) -> BaseReference:
        """The KL reference: this model with its adapters disabled (`BaseReference`)."""
        return BaseReference(self)

    @contextmanager
    def adapters_off(self) -> Iterator[None]:
        """Within: the base model (adapters disabled, eval mode, no gradient); after: as before."""
        training = self.model.training
        self.model.eval()  # as a separately loaded reference model would be (no dropout)
        try:
            with torch.no_grad(), self.peft.disable_adapter():
                yield
        finally:
            self.model.train(training)

    def save_pretrained(self, directory: str | Path, **_: Any) -> None:
        """The adapter files into `directory` (peft: ``adapter_config.json``, ``adapter_model.safetensors``).
        Named as a model's ``save_pretrained``, so a checkpoint writer takes either (`train.sft.save_checkpoint`)."""
        self.save_adapter(directory)

    def save_adapter(self, directory: str | Path) -> None:
        """As `save_pretrained`."""
        # save_embedding_layers=False: no embedding is adapted (`_check_targets`), and "auto" would
        # look up the base model's config, on the Hub when its local directory is gone
        self.peft.save_pretrained(str(directory), safe_serialization=True, save_embedding_layers=False)

    def load_adapter(self, directory: str | Path) -> None:
        """Load a saved adapter directory into this model's adapters (in place).

        Raises:
            FileNotFoundError: no adapter files in `directory`.
            ValueError: adapters of another rank, alpha or target set (a silent scaling change
                otherwise), or tensors that do not fit.
        """
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        d = Path(directory)
        if not (d / "adapter_config.json").is_file() or not (d / "adapter_model.safetensors").is_file():
            raise FileNotFoundError(f"{d}: no adapter_config.json + adapter_model.safetensors (a LoRA save)")
        saved = json.loads((d / "adapter_config.json").read_text())
        own = {"r": self.cfg.r, "lora_alpha": self.cfg.lora_alpha, "target_modules": sorted(self.cfg.target_modules)}
        theirs = {k: sorted(saved.get(k) or []) if k == "target_modules" else saved.get(k) for k in own}
        if theirs != own:
            raise ValueError(f"{d}: adapters saved with {theirs}, this model's lora settings are {own}")
        res = set_peft_model_state_dict(self.peft, load_peft_weights(str(d), device="cpu"))
        missing = [k for k in res.missing_keys if "lora_" in k]
        if missing or res.unexpected_keys:
            raise ValueError(f"{d}: adapters do not fit: missing {missing[:4]}, unexpected {res.unexpected_keys[:4]}")

    def merged(self, dtype: torch.dtype | None = None) -> Any:
        """A plain Hugging Face model (no peft layers) whose weights are the adapted ones merged:
        ``W + (alpha / r) B A`` per adapted layer (peft's ``get_delta_weight``), the other tensors
        shared with `model` where `dtype` is theirs (no copy). The training model is not changed.

        Args:
            dtype: the merged model's dtype (None: the base's).
        """
        from transformers import AutoModelForCausalLM

        state = merged_state_dict(self.model, dtype)
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(copy.deepcopy(self.model.config))
        plain.load_state_dict(state, strict=True, assign=True)
        own = dict(self.model.named_buffers())
        for name, buf in plain.named_buffers():  # the non-persistent ones (rotary inv_freq) are not in `state`
            if buf.is_meta:
                parent, _, leaf = name.rpartition(".")
                plain.get_submodule(parent).register_buffer(leaf, own[name], persistent=False)
        plain.tie_weights()  # one tensor for tied input/output embeddings, as the base had
        plain.generation_config = copy.deepcopy(self.model.generation_config)  # eos ids and sampling defaults
        return plain.eval()

    def export(self, directory: str | Path, dtype: torch.dtype | None = None) -> None:
        """The merged model in `dtype` (None: the base's) as a Hugging Face directory (`merged`),
        the adapters in ``directory/adapter`` (`save_adapter`). `directory` must exist or be creatable."""
        from evoharness.train.precision import save_exported

        dtype = dtype or self.model.get_input_embeddings().weight.dtype
        save_exported(self.merged(dtype), directory, dtype)
        self.save_adapter(Path(directory) / ADAPTER_DIR)


class BaseReference:
    """The base model seen through a `LoRAModel`: every call runs with the adapters disabled,
    in eval mode, without gradient; anything else (``config``, ``parameters``, ``device``) is the
    model's own. It stands wherever a frozen reference model is called (`train.trainer.Trainer`'s
    ``ref_model``: `train.grpo.completion_logits` and `train.packing.target_logits` call the
    model, ``get_decoder()`` and ``get_output_embeddings()``), at the cost of one forward and
    no second copy of the weights. Not thread-safe: it toggles the shared model's adapters."""

    def __init__(self, lora: LoRAModel):
        self._lora, self._model = lora, lora.model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lora.adapters_off():
            return self._model(*args, **kwargs)

    def get_decoder(self) -> _WithAdaptersOff:
        return _WithAdaptersOff(self._model.get_decoder(), self._lora)

    def get_output_embeddings(self) -> _WithAdaptersOff:
        return _WithAdaptersOff(self._model.get_output_embeddings(), self._lora)


class _WithAdaptersOff:
    """A submodule of a `LoRAModel` whose calls run with the adapters off (`BaseReference`)."""

    def __init__(self, module: torch.nn.Module, lora: LoRAModel):
        self._module, self._lora = module, lora

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lora.adapters_off():
            return self._module(*args, **kwargs)


# ---- tensors -------------------------------------------------------------------------------------


def merged_state_dict(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The state dict of `model` without its peft layers: adapted weights merged (computed in fp32,
    stored in `dtype`), ``….base_layer.weight`` renamed ``….weight``, adapter tensors left out.
    Tensors that share storage (tied embeddings) still share it.

    Raises:
        ValueError: adapters already merged in place (their update would count twice).
    """
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, LoraLayer):
            if module.merged:
                raise ValueError(f"{prefix}: adapters merged in place; unmerge them first")
            active = [a for a in module.active_adapters if a in module.lora_A or a in module.lora_embedding_A]
            if active and not module.disable_adapters:
                deltas[f"{prefix}.base_layer.weight"] = sum(module.get_delta_weight(a).float() for a in active)
    skip = set(adapter_parameters(model))
    out: dict[str, torch.Tensor] = {}
    converted: dict[tuple, torch.Tensor] = {}  # one converted tensor per storage: tied weights stay tied
    for name, t in model.state_dict().items():
        if name in skip:
            continue
        if name in deltas:
            t = (t.float() + deltas[name].to(t.device)).to(dtype or t.dtype)
        else:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if key not in converted:
                converted[key] = t.to(dtype or t.dtype)
            t = converted[key]
        out[name.replace(".base_layer.", ".")] = t
    return out


# ---- checks --------------------------------------------------------------------------------------


def _check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Raise ValueError for target names no module of `model` matches (peft's rule: the full name
    or its last dotted components) and for targets on tied embeddings (the merged export would
    lose the update: a tied config re-ties the output head to the input embedding on load)."""
    names = [n for n, _ in model.named_modules() if n]
    hits = {t: [n for n in names if n == t or n.endswith("." + t)] for t in targets}
    unmatched = [t for t, found in hits.items() if not found]
    if unmatched:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(
            f"lora.target_modules {unmatched} match no module of this {type(model).__name__}; "
            f"its linear layers: {linear}"
        )
    if getattr(model.config, "tie_word_embeddings", False):
        tied = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
        modules = dict(model.named_modules())
        on_tied = sorted({t for t, found in hits.items() if any(id(modules[n]) in tied for n in found)})
        if on_tied:
            raise ValueError(
                f"lora.target_modules {on_tied} adapt the tied input/output embeddings; target the projections instead"
            )
