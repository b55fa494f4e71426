"""A `Plan` as text: per device and process the terms (GiB, phase, how), totals, verdict, footnotes."""

from __future__ import annotations

from evoharness.plan.memory import GIB, count
from evoharness.plan.planner import DevicePlan, Owner, Plan

# the assumptions every plan rests on (plan.memory's docstring has the formulas and sources)
GENERAL_NOTES = (
    "full fine-tuning with AdamW: fp32 masters 4 B + fp32 gradients 4 B + two fp32 moments 8 B per parameter "
    "(16 B/param, Rajbhandari et al. 2020); FSDP2 divides all three by the ranks",
    "activations: the tensors Hugging Face's Qwen3 decoder layer saves for backward, counted per token and layer "
    "(SDPA's fused attention: no T x T scores saved; cf. Korthikanti et al. 2022); with checkpointing each layer's "
    "fp32 input plus one layer recomputed",
    "logits: 16 B per (loss position, vocabulary id): the fp32 log-softmax, token masks and two fp32 temporaries",
    "not planned: host RAM of GPU runs (checkpoint writes, data), CUDA allocator fragmentation, other tenants of "
    "a device",
    "GiB = 2^30 bytes; an H100 80GB has about 79.6 GiB (81,559 MiB), an H200 140.4 GiB (143,771 MiB)",
)


def size(b: float) -> str:
    """Bytes as ``12.34 GiB`` or, under 1 GiB, ``123.4 MiB`` (11 characters, right-aligned)."""
    return f"{b / GIB:>7.2f} GiB" if b >= GIB else f"{b / 2**20:>7.1f} MiB"


def _group(owners: list[Owner]) -> list[tuple[str, Owner]]:
    """Owners with identical terms printed once: ``cells 1, 2, 3 (each)``."""
    groups: dict[tuple, list[Owner]] = {}
    for o in owners:
        groups.setdefault(tuple(o.terms), []).append(o)
    out = []
    for same in groups.values():
        label = same[0].name if len(same) == 1 else f"{', '.join(o.name for o in same)} (each)"
        out.append((label, same[0]))
    return out


def _signature(d: DevicePlan) -> tuple:
    return d.capacity, [tuple(o.terms) for o in d.owners.values()]


def _alike(devices: list[DevicePlan]) -> list[list[DevicePlan]]:
    """Consecutive devices holding the same terms (one cell or rank each, say) as one group."""
    groups: list[list[DevicePlan]] = []
    for d in devices:
        if groups and _signature(groups[-1][0]) == _signature(d):
            groups[-1].append(d)
        else:
            groups.append([d])
    return groups


def render(plan: Plan) -> str:
    """The plan as a table with a verdict line and numbered footnotes."""
    L = plan.layout
    kinds = "host RAM" if plan.kind == "cpu" else f"{len(plan.devices)} CUDA device(s)"
    lines = [
        f"memory plan: evoharness {plan.stage}, model {L.name} ({count(L.params())} parameters: h {L.hidden}, "
        f"{L.layers} layers, {L.heads}/{L.kv_heads} heads x {L.head_dim}, MLP {L.intermediate}, vocab {L.vocab}"
        f"{', tied' if L.tied else ''}) on {kinds}",
        "",
    ]
    for same in _alike(plan.devices):
        d = same[0]
        if len(same) == 1:
            lines.append(f"{d.label} ({d.capacity / GIB:.1f} GiB)")
        else:
            cap = d.capacity / GIB
            lines.append(f"{d.label} .. {same[-1].label}: {len(same)} devices with the same plan ({cap:.1f} GiB each)")
        for label, o in _group(list(d.owners.values())):
            lines.append(f"  {label}")
            for t in o.terms:
                phase = "" if t.phase == "always" else f"[{t.phase}]"
                lines.append(f"    {t.role:<15} {t.what:<34} {size(t.bytes)} {phase:<10} {t.how}")
            lines.append(f"    {'peak':<50} {size(o.peak)} (resident + largest phase)")
        mark = "over" if d.total > d.capacity else "ok"
        lines.append(f"  {'device total':<52} {size(d.total)} of {d.capacity / GIB:.1f} GiB: {mark}")
        lines.append("")
    lines.append(f"verdict: {plan.verdict}")
    for p in plan.problems[1:]:
        lines.append(f"         also: {p}")
    lines += ["", "assumptions:"]
    for i, n in enumerate([*plan.notes, *GENERAL_NOTES], 1):
        lines.append(f"  [{i}] {n}")
    return "\n".join(lines)
