"""The memory plan of an RL or SFT run: per device and role, what it holds, and whether it fits.

`plan_run(cfg, device_memory_gib)` places the run's processes (`plan.placement`), prices each
role (`plan.memory`), and sums per device: a process's peak is its resident terms plus the largest
of its train, rollout and eval phases (a cell trains, rolls out and evaluates in turn), and a
device's total is the sum over the processes on it (processes are not assumed to take turns). The
verdict compares each device's total with its memory. `Plan.notes` lists every assumption the
numbers rest on; `plan.render.render` prints it all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from evoharness.config.rl import RLConfig
from evoharness.config.sft import SFTConfig
from evoharness.plan import memory
from evoharness.plan.layouts import Layout, resolve_layout
from evoharness.plan.memory import GIB, Term
from evoharness.plan.placement import Slot, device_index, rl_on_cuda, rl_slots, sft_slots, train_cell_count

PHASES = ("train", "rollout", "eval")  # a process does one of these at a time
VALID_SEEN_GAMES = 140  # the evaluator's episodes when eval_limit is None (the valid_seen panel)
MAX_CALL_BATCH = 64  # calls a cell answers together (runtime.cell.MAX_CALL_BATCH; tested equal)
UNSHARDED_CKPT_NOTE = (
    "shard.activation_checkpointing is applied by FSDP ranks (train.sharded.shard_model); this unsharded trainer "
    "keeps every layer's activations, and they are counted so"
)
CUDA_NOTE = "CUDA: fp32 masters, bf16 compute (autocast); 1 GiB per process and device for the CUDA context"


@dataclass
class Owner:
    """One process's terms on one device."""

    name: str
    terms: list[Term] = field(default_factory=list)

    def phase_bytes(self, phase: str) -> float:
        return sum(t.bytes for t in self.terms if t.phase == phase)

    @property
    def peak(self) -> float:
        """Resident terms plus the largest phase (a cell trains, rolls out and evaluates in turn)."""
        return self.phase_bytes("always") + max(self.phase_bytes(p) for p in PHASES)


@dataclass
class DevicePlan:
    """One device: its memory (bytes) and the processes' terms on it."""

    index: int
    kind: str  # "cuda" or "cpu" (host RAM)
    capacity: float
    owners: dict[str, Owner] = field(default_factory=dict)

    def add(self, owner: str, terms: list[Term]) -> None:
        self.owners.setdefault(owner, Owner(owner)).terms.extend(terms)

    @property
    def total(self) -> float:
        return sum(o.peak for o in self.owners.values())

    @property
    def label(self) -> str:
        return "host RAM" if self.kind == "cpu" else f"cuda:{self.index}"


@dataclass
class Plan:
    """A run's memory plan.

    Attributes:
        stage: ``rl`` or ``sft``; layout: the model planned; kind: ``cuda`` or ``cpu``.
        devices: one `DevicePlan` per device (bytes).
        needed_devices: devices the config places processes on.
        notes: the assumptions and remarks printed under the table.
        problems: placement errors (too few devices); each makes the plan not fit.
    """

    stage: str
    layout: Layout
    kind: str
    devices: list[DevicePlan]
    needed_devices: int
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems and all(d.total <= d.capacity for d in self.devices)

    @property
    def verdict(self) -> str:
        """``fits`` or ``does not fit: needs X GiB on device k, has Y GiB`` (the most over-full device)."""
        if self.problems:
            return f"does not fit: {self.problems[0]}"
        over = [d for d in self.devices if d.total > d.capacity]
        if not over:
            return "fits"
        d = max(over, key=lambda d: d.total - d.capacity)
        need, has = d.total / GIB, d.capacity / GIB
        return f"does not fit: needs {need:.1f} GiB on {d.label} (device {d.index}), has {has:.1f} GiB"


def compute_bytes_rl(cfg: RLConfig) -> int:
    """Bytes of the RL forward dtype (``dtype``; auto: bf16 on CUDA, fp32 on CPU)."""
    if cfg.dtype == "auto":
        return 2 if rl_on_cuda(cfg) else 4
    return 4 if cfg.dtype in ("float32", "fp32") else 2


def compute_bytes_sft(cfg: SFTConfig) -> int:
    """Bytes of the SFT forward dtype (``precision``; auto: bf16 autocast on CUDA, fp32 on CPU)."""
    if cfg.precision == "auto":
        return 2 if cfg.device.startswith("cuda") else 4
    return 2 if cfg.precision == "bf16_autocast" else 4


def _devices(kind: str, count: int, capacity_gib: float | list[float]) -> list[DevicePlan]:
    caps = capacity_gib if isinstance(capacity_gib, list) else [capacity_gib] * count
    return [DevicePlan(i, kind, c * GIB) for i, c in enumerate(caps)]


def _lora(layout: Layout, lora) -> int:
    return layout.lora_params(lora.r, lora.target_modules) if lora.enabled else 0


def _policy_weights(layout: Layout, lora_params: int, compute: int) -> list[Term]:
    """A model that serves but does not train (a rollout-only cell's, the evaluator's): fp32
    weights, or with LoRA the base in the compute dtype plus fp32 adapters."""
    P, A = layout.params(), lora_params
    if A:
        how = f"{memory.count(P)} x {compute} B + {memory.count(A)} x 4 B"
        return [Term("rollout engine", "weights (base + adapters)", compute * P + 4.0 * A, how)]
    return [Term("rollout engine", "weights (fp32 policy)", 4.0 * P, f"{memory.count(P)} x 4 B")]


def _place(devs: list[DevicePlan], plan: Plan, idx: int, owner: str, terms: list[Term]) -> None:
    if idx >= len(devs):
        plan.problems.append(
            f"{owner} is placed on device {idx} but the plan has {len(devs)} device(s) "
            f"(the config needs {plan.needed_devices})"
        )
        return
    devs[idx].add(owner, terms)


def plan_rl(
    cfg: RLConfig,
    device_memory_gib: float | list[float],
    devices: int | None = None,
    layout: Layout | None = None,
    gpu_memory_utilization: float | None = None,
) -> Plan:
    """The memory plan of `evoharness rl` with `cfg`.

    Args:
        device_memory_gib: each device's memory in GiB (one number for all, or one per device);
            host RAM for a CPU run.
        devices: devices available (None: as many as the config places processes on).
        layout: the model (None: `resolve_layout(cfg.model_path, cfg.layout)`).
        gpu_memory_utilization: vLLM's share of each GPU (None: ``runtime.vllm_gpu_memory_utilization``).

    Raises:
        ValueError: no architecture to plan (`resolve_layout`), a bad device string or LoRA target.
    """
    layout = layout or resolve_layout(cfg.model_path, cfg.layout)
    rt, g = cfg.runtime, cfg.grpo
    on_cuda = rl_on_cuda(cfg)
    kind = "cuda" if on_cuda else "cpu"
    slots, needed = rl_slots(cfg)
    n = devices if devices is not None else needed
    plan = Plan("rl", layout, kind, _devices(kind, n, device_memory_gib), needed)
    if devices is not None and devices < needed:
        plan.problems.append(f"the config places its processes on {needed} device(s); the plan has {devices}")
    compute = compute_bytes_rl(cfg)
    lora = _lora(layout, cfg.lora)
    trainer = rt.resolved_trainer()
    ranks = train_cell_count(cfg) if trainer == "fsdp" else 1
    max_len = cfg.max_prompt_tokens + cfg.max_new_tokens
    rolling = [s for s in slots if s.rolls_out]
    seqs = min(MAX_CALL_BATCH, rt.capacity or math.ceil(g.prompts_per_step * g.group_size / max(1, len(rolling))))
    ckpt = checkpointing(cfg.shard, ranks)
    rows, seq = (g.micro_batch_size, g.pack_tokens) if g.packing else (g.micro_batch_size, max_len)
    positions = rows * (g.pack_tokens if g.packing else cfg.max_new_tokens)
    act = memory.activations(layout, rows, seq, positions, compute, ckpt, padded=True)
    if cfg.sft_anchor is not None:  # its batches run between the GRPO micro-batches: the larger counts
        a = cfg.sft_anchor
        seq = min(a.max_prompt_tokens + a.max_completion_tokens, a.batch_tokens)
        rows = max(1, a.batch_tokens // seq)
        anchor = memory.activations(layout, rows, seq, rows * a.max_completion_tokens, compute, ckpt, False)
        if sum(t.bytes for t in anchor) > sum(t.bytes for t in act):
            act = [Term(t.role, f"{t.what}, SFT anchor", t.bytes, t.how, t.phase) for t in anchor]
    if not on_cuda:
        act.append(memory.cpu_heap(act))
    share = gpu_memory_utilization if gpu_memory_utilization is not None else rt.vllm_gpu_memory_utilization
    for s in slots:
        _plan_cell(plan, s, cfg, layout, compute, lora, ranks, act, seqs, max_len, share)
    _plan_driver(plan, cfg, layout, compute, lora, max_len, slots)
    plan.notes += _rl_notes(cfg, on_cuda, trainer, ranks, lora, seqs, max_len)
    if on_cuda and rt.rollout_engine == "vllm":
        plan.notes.append(_vllm_share_note(plan, layout, seqs, max_len, compute, share))
    return plan


def checkpointing(shard, ranks: int) -> bool:
    """Whether activations are recomputed: ``shard.activation_checkpointing`` is applied by FSDP
    ranks (`train.sharded.shard_model`), so only where the trainer is sharded."""
    return shard.activation_checkpointing and ranks > 1


def _vllm_share_note(plan: Plan, layout: Layout, seqs: int, max_len: int, compute: int, share: float) -> str:
    """The range of ``gpu_memory_utilization`` that works: at least the engine's weights, workspace
    and KV cache for the sequences a cell answers at once; at most what the rest of its device leaves."""
    lo, hi = 0.0, 1.0
    need = compute * layout.params() + memory.VLLM_WORKSPACE_BYTES + memory.kv_cache(layout, seqs, max_len, compute)
    for d in plan.devices:
        for o in d.owners.values():
            engine = sum(t.bytes for t in o.terms if t.role == "rollout engine")
            if engine:
                lo = max(lo, need / d.capacity)
                hi = min(hi, (d.capacity - (d.total - engine)) / d.capacity)
    return (
        f"vLLM's share (runtime.vllm_gpu_memory_utilization) is planned at {share:.2f}; it should be at least "
        f"{math.ceil(lo * 100) / 100:.2f} (weights, workspace, KV cache for {seqs} sequences of {max_len} tokens) and "
        f"at most {math.floor(hi * 100) / 100:.2f} (what the rest of its device leaves)"
    )


def _plan_cell(
    plan: Plan,
    s: Slot,
    cfg: RLConfig,
    layout: Layout,
    compute: int,
    lora: int,
    ranks: int,
    act: list[Term],
    seqs: int,
    max_len: int,
    share: float,
) -> None:
    """One RL cell's terms on its devices: its trainer and KL reference where it trains, its engine
    where it rolls out (a rollout-only cell holds its own policy weights), its runtime."""
    devs, on_cuda = plan.devices, plan.kind == "cuda"
    if s.trains:
        state = memory.trainer_state(
            layout, lora, ranks, compute, on_cuda, s.optimizer, cfg.shard.reshard_after_forward
        )
        _place(devs, plan, s.model_device, s.name, state + act)
        if cfg.grpo.kl_beta > 0 and not lora:
            _place(devs, plan, s.ref_device, s.name, memory.reference(layout, compute))
    if s.rolls_out and not s.trains:  # the cell's torch model: the weights holder of either engine
        _place(devs, plan, s.model_device, s.name, _policy_weights(layout, lora, compute))
    if s.rolls_out and cfg.runtime.rollout_engine == "vllm":  # one engine on the cell's first GPU (no TP)
        d = s.model_device
        cap = devs[min(d, len(devs) - 1)].capacity  # an out-of-range device is already a problem
        cpu_kv = None if on_cuda else cfg.runtime.vllm_cpu_kv_cache_gib * GIB
        terms, room = memory.vllm_engine(layout, seqs, max_len, compute, 1, share * cap, cpu_kv)
        _place(devs, plan, d, s.name, terms)
        if room < 1 and not any("vLLM" in p for p in plan.problems):
            plan.problems.append(
                f"vLLM's KV cache on device {d} holds no sequence of max_prompt_tokens + max_new_tokens = "
                f"{max_len} tokens: vLLM refuses to start (raise runtime.vllm_"
                f"{'gpu_memory_utilization' if on_cuda else 'cpu_kv_cache_gib'})"
            )
        elif room < seqs:  # vLLM queues the rest
            note = f"vLLM has room for {room} of the {seqs} sequences a cell answers at once"
            if note not in plan.notes:
                plan.notes.append(note)
    elif s.rolls_out:
        _place(devs, plan, s.model_device, s.name, memory.hf_engine(layout, seqs, max_len, compute, on_cuda, lora > 0))
    used = sorted(set(s.devices) | {s.model_device} | ({s.ref_device} if s.trains else set()))
    for d in used if on_cuda else [0]:
        _place(devs, plan, d, s.name, memory.runtime(on_cuda))


def _plan_driver(
    plan: Plan, cfg: RLConfig, layout: Layout, compute: int, lora: int, max_len: int, slots: list[Slot]
) -> None:
    """The driver process: the evaluator's own policy (``eval_every > 0``; all its episodes decode
    at once), and on CPU the driver process itself (backends ``local`` / ``ray``) and a local Ray head."""
    on_cuda, rt = plan.kind == "cuda", cfg.runtime
    inprocess = rt.backend == "inprocess"
    owner = slots[0].name if inprocess else "driver"
    # the driver sees every GPU: its evaluator sits on `device` itself
    where = slots[0].model_device if inprocess else (device_index(cfg.device) if on_cuda else 0)
    if cfg.eval_every > 0 and cfg.env == "alfworld":
        episodes = cfg.eval_limit or VALID_SEEN_GAMES
        terms = [Term("evaluator", t.what, t.bytes, t.how) for t in _policy_weights(layout, lora, compute)]
        terms += memory.hf_engine(layout, episodes, max_len, compute, on_cuda, lora > 0, "evaluator", "eval")
        if not inprocess and on_cuda:
            terms += memory.runtime(True)
        _place(plan.devices, plan, where, owner, terms)
    if not on_cuda and not inprocess:
        head = rt.backend == "ray" and not rt.ray_address  # a local Ray head on this machine
        _place(plan.devices, plan, 0, "driver", memory.runtime(False, 1, ray=head))


def _rl_notes(cfg: RLConfig, on_cuda: bool, trainer: str, ranks: int, lora: int, seqs: int, max_len: int) -> list[str]:
    rt, g = cfg.runtime, cfg.grpo
    notes = [
        f"{rt.cells} cell(s), schedule {rt.schedule}, trainer {trainer}"
        + (f" ({ranks} FSDP2 ranks)" if ranks > 1 else "")
        + f", rollout engine {rt.rollout_engine}; a process's peak is its resident state plus the largest of "
        "its train, rollout and eval phases (done in turn); the processes on one device are summed",
        f"micro-batch: {g.micro_batch_size} x {max_len}-token rows (max_prompt_tokens + max_new_tokens)"
        + (f"; packing: rows of {g.pack_tokens} tokens" if g.packing else ""),
        f"rollout: {seqs} sequences at once per rollout cell (runtime.capacity, else the step's "
        f"{g.prompts_per_step} x {g.group_size} executions over the rollout cells; at most {MAX_CALL_BATCH} calls "
        f"per batch), each up to {max_len} tokens",
    ]
    if cfg.shard.activation_checkpointing and ranks == 1:
        notes.append(UNSHARDED_CKPT_NOTE)
    if lora:
        notes.append(_lora_note(cfg.lora, lora))
    if g.kl_beta > 0:
        notes.append(
            "KL reference: the base with adapters disabled (no copy)"
            if lora
            else "KL reference: a full unsharded copy in the compute dtype on each train cell's ref_device"
        )
    if on_cuda:
        notes.append(CUDA_NOTE)
    if trainer == "fsdp" and cfg.shard.ranks not in (1, ranks):
        notes.append(
            f"runtime.trainer fsdp shards over the {ranks} train cells; shard.ranks {cfg.shard.ranks} is unused"
        )
    if rt.backend == "ray" and rt.ray_address:
        notes.append("cells on a Ray cluster: its machines' memory is planned as the devices given here")
    return notes


def _lora_note(lora, params: int) -> str:
    return (
        f"LoRA r {lora.r} on {', '.join(lora.target_modules)}: {memory.count(params)} adapter parameters "
        "(fp32, in AdamW); "
        "the frozen base in the compute dtype; activations counted as full fine-tuning's (the adapters' saved "
        "inputs stand in for the frozen layers')"
    )


def plan_sft(
    cfg: SFTConfig,
    device_memory_gib: float | list[float],
    devices: int | None = None,
    model_path: str | None = None,
    layout: Layout | None = None,
) -> Plan:
    """The memory plan of `evoharness sft` with `cfg` on the model in `model_path` (or ``cfg.layout``).

    Args: as `plan_rl`'s; model_path: the SFT command's ``--model-path``.

    Raises:
        ValueError: as `plan_rl`.
    """
    layout = layout or resolve_layout(model_path, cfg.layout)
    on_cuda = cfg.device.startswith("cuda")
    kind = "cuda" if on_cuda else "cpu"
    slots, needed = sft_slots(cfg)
    n = devices if devices is not None else needed
    plan = Plan("sft", layout, kind, _devices(kind, n, device_memory_gib), needed)
    if devices is not None and devices < needed:
        plan.problems.append(f"the config places its ranks on {needed} device(s); the plan has {devices}")
    compute = compute_bytes_sft(cfg)
    lora = _lora(layout, cfg.lora)
    micro = cfg.micro_batch_tokens or cfg.batch_tokens
    longest = cfg.max_prompt_tokens + cfg.max_completion_tokens
    # the padded budget filled (a row longer than the budget runs alone), in rows as long as they
    # come, each with a full completion; packing: one tree-packed row of the budget
    tokens = micro if cfg.packing else max(micro, longest)
    rows = 1 if cfg.packing else math.ceil(tokens / longest)
    seq = tokens // rows
    positions = rows * seq if cfg.prompt_loss_weight > 0 or cfg.packing else rows * cfg.max_completion_tokens
    act = memory.activations(
        layout, rows, seq, positions, compute, checkpointing(cfg.shard, cfg.shard.ranks), cfg.packing
    )
    if not on_cuda:
        act.append(memory.cpu_heap(act))
    for s in slots:
        state = memory.trainer_state(
            layout, lora, cfg.shard.ranks, compute, on_cuda, True, cfg.shard.reshard_after_forward
        )
        _place(plan.devices, plan, s.model_device, s.name, state + act + memory.runtime(on_cuda))
    plan.notes += [
        f"{cfg.shard.ranks} trainer rank(s)" + (" (FSDP2)" if cfg.shard.ranks > 1 else ""),
        f"micro-batch: {rows} x {seq}-token rows ({'micro_batch_tokens' if cfg.micro_batch_tokens else 'batch_tokens'}"
        f" = {micro} padded tokens filled, rows of at most max_prompt_tokens + max_completion_tokens = {longest})",
    ]
    if cfg.shard.activation_checkpointing and cfg.shard.ranks == 1:
        plan.notes.append(UNSHARDED_CKPT_NOTE)
    if lora:
        plan.notes.append(_lora_note(cfg.lora, lora))
    if on_cuda:
        plan.notes.append(CUDA_NOTE)
    return plan


def plan_run(
    cfg: RLConfig | SFTConfig,
    device_memory_gib: float | list[float],
    devices: int | None = None,
    model_path: str | None = None,
    gpu_memory_utilization: float | None = None,
) -> Plan:
    """`plan_rl` or `plan_sft` by the config's type (`model_path` overrides an RL config's)."""
    if isinstance(cfg, RLConfig):
        if model_path:
            cfg = cfg.model_copy(update={"model_path": str(model_path)})
        return plan_rl(cfg, device_memory_gib, devices, gpu_memory_utilization=gpu_memory_utilization)
    return plan_sft(cfg, device_memory_gib, devices, model_path)
