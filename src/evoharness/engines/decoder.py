"""`StaticKVDecoder`: a lean forward pass of a Qwen3-family causal LM over a
pre-allocated KV cache, for decoding many sequences at once.

Why not the Hugging Face forward: a decode step of a 1-10M parameter model is
a few dozen small matmuls, and the module forward adds per-step work around
them (module calls, mask building, cache bookkeeping). Measured here at batch
32 (1 thread, 2026-11-30, 25th-percentile CPU ms per step, ~330-token
contexts): HF forward + `StaticCache` 7.96 / 22.9 ms (1.8M / 10M model),
+ `DynamicCache` 8.26 / 29.5, this loop 5.44 / 18.6 before and ~4.5 / ~13
after oneDNN-packed linears and the transposed cache (A/B runs under load
5-8, CPU time). Of the 1.8M model's 4.5 ms, attention over the KV cache is
2.5 ms (26 MB read: 0.64 ms at the core's 41 GB/s; one-thread BLAS runs these
2-row products at ~12 GB/s from a cold cache), the linears ~0.7 ms and the
~120 small per-layer ops the rest (benchmarks/results/bench_decode.txt has
the floor analysis). This module runs the same arithmetic as ``Qwen3ForCausalLM``
(RMSNorm, q/k-norm, RoPE from the model's own rotary module, grouped-query
SDPA, SwiGLU MLP, tied or untied head) as plain tensor ops on the model's own
weights, with:

- one KV buffer ``[layers, 2, B, kv_heads, head_dim, T]`` (keys and values
  transposed, see `_cache`; reused across calls when it fits) written in
  place: column ``t`` holds every row's step-``t`` key/value (prompts are
  left-padded), so a decode step writes one column;
- fused q/k/v and gate/up projections with oneDNN pre-packed weights
  (`PackedLinear`: ~2x `F.linear` here), rebuilt when any model parameter
  changes in place (an optimizer step, ``load_state_dict``: seen in the
  parameters' version counters), so weight sync needs no call here; they are a
  second copy of the model's weights;
- the attention scale folded into the queries' weights;
- prefill of the batch-wide common prefix once, then of each group prefix once
  (rows sharing a longer prefix: a GRPO group), then the rest in length-sorted
  chunks;
- decode attention that reads the batch-wide prefix once for all rows
  (`_cascade`) and groups the query heads of a kv head as query rows.

Supported: ``model_type`` qwen3 / qwen2 / llama without sliding windows and
with SiLU MLPs (`StaticKVDecoder.unsupported` says why a model is not).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from evoharness.engines.packed import PackedLinear

SUPPORTED_TYPES = ("qwen3", "qwen2", "llama")


@dataclass
class _Layer:
    ln1: torch.Tensor
    qkv: PackedLinear
    qk_norm: torch.Tensor | None  # [Hq + Hk, D]: q_norm weight per query head, then k_norm per kv head
    o: PackedLinear
    ln2: torch.Tensor
    gu: PackedLinear
    down: PackedLinear


@dataclass
class DecodeState:
    """The KV cache and per-row positions of one batch being decoded.

    Attributes:
        kv: [layers, 2, B, Hk, D, T] keys/values, transposed (see `StaticKVDecoder._cache`);
            column ``t`` is written next.
        bias: [B, 1, 1, T] additive attention bias (0, or -inf on padding columns).
        pos: [B] RoPE position of the next token of each row.
        t: the next cache column (shared by all rows: prompts are left-padded).
        shared: columns ``[0, shared)`` hold the prompts' common prefix, the same in
            every row; decode attends to it once for the whole batch (row 0's copy).
    """

    kv: torch.Tensor
    bias: torch.Tensor
    pos: torch.Tensor
    t: int
    shared: int = 0

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current batch), in that order."""
        self.kv = self.kv.index_select(2, rows)
        self.bias, self.pos = self.bias[rows], self.pos[rows]


class StaticKVDecoder:
    """Prefill and decode for a Qwen3-family HF model (see module docstring).

    Args:
        model: a loaded HF causal LM (eval mode); its device and dtype are used.

    Raises:
        ValueError: the model is not supported (`unsupported` gives the reason).
    """

    def __init__(self, model: PreTrainedModel):
        why = self.unsupported(model)
        if why:
            raise ValueError(f"StaticKVDecoder cannot run this model: {why}")
        c = model.config
        self.model = model
        self.H, self.Hq, self.Hk = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.G = self.Hq // self.Hk
        self.eps = c.rms_norm_eps
        self.n_layers = c.num_hidden_layers
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self._sig: tuple | None = None
        self._layers: list[_Layer] = []
        self._rope = torch.empty(0, 2, self.D, device=self.device, dtype=self.dtype)
        self._pool: torch.Tensor | None = None
        self.cascade = True  # decode reads the shared prefix once (see `_cascade`)
        self.prefill_chunk_tokens = 16384  # rows prefilled together: bounds padding and activation memory

    @staticmethod
    def unsupported(model: PreTrainedModel) -> str | None:
        """Why the lean forward cannot run `model` (None when it can)."""
        c = model.config
        if getattr(c, "model_type", None) not in SUPPORTED_TYPES:
            return f"model_type {getattr(c, 'model_type', None)!r} not in {SUPPORTED_TYPES}"
        if getattr(c, "use_sliding_window", False) or "sliding_attention" in (getattr(c, "layer_types", None) or []):
            return "sliding-window attention"
        if getattr(c, "hidden_act", "silu") != "silu":
            return f"hidden_act {c.hidden_act!r}"
        if getattr(c, "mlp_bias", False):
            return "MLP biases"
        if any("lora_" in n for n, _ in model.named_parameters()):  # it would read the base weights alone
            return "LoRA adapters (peft layers; serve a merged export, or the HF engine)"
        return None

    # ---- weights -------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Rebuild the fused weights if any parameter changed since the last call; True if rebuilt."""
        params = list(self.model.parameters())
        sig = tuple((q.data_ptr(), q._version) for q in params)
        if sig == self._sig:
            return False
        with torch.no_grad():
            self._build()
        self._sig = tuple((q.data_ptr(), q._version) for q in params)
        return True

    def _build(self) -> None:
        m = self.model.model
        layers = []
        scale = self.D**-0.5
        for lay in m.layers:
            a, mlp = lay.self_attn, lay.mlp
            bias = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
            qn = getattr(a, "q_norm", None)
            # the attention scale D^-1/2 is folded into the queries (q-norm weight, else the q
            # projection; RoPE is linear): attention products run with scale 1
            wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
            bqkv = torch.cat(bias).detach() if bias[0] is not None else None
            qk_norm = None
            if qn is not None:
                qk_norm = torch.cat(
                    [qn.weight.expand(self.Hq, self.D) * scale, a.k_norm.weight.expand(self.Hk, self.D)]
                )
            else:
                wqkv[: self.Hq * self.D] *= scale
                if bqkv is not None:
                    bqkv[: self.Hq * self.D] *= scale
            layers.append(
                _Layer(
                    ln1=lay.input_layernorm.weight.detach(),
                    qkv=PackedLinear(wqkv, bqkv),
                    qk_norm=qk_norm.detach().contiguous() if qk_norm is not None else None,
                    o=PackedLinear(a.o_proj.weight, a.o_proj.bias),
                    ln2=lay.post_attention_layernorm.weight.detach(),
                    gu=PackedLinear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                    down=PackedLinear(mlp.down_proj.weight),
                )
            )
        self._layers = layers
        self._embed = m.embed_tokens.weight.detach()
        self._norm = m.norm.weight.detach()
        self._head = PackedLinear(self.model.get_output_embeddings().weight)

    def _rope_rows(self, n: int) -> torch.Tensor:
        """[>= n, 2, D] (cos, signed sin) per position, from the model's own rotary module;
        the first half of the sin row is negated (see `_rot`)."""
        if self._rope.shape[0] < n:
            size = max(n, 2 * self._rope.shape[0], 1024)
            pos = torch.arange(size, device=self.device)[None]
            dummy = torch.empty(1, device=self.device, dtype=self.dtype)
            cos, sin = self.model.model.rotary_emb(dummy, pos)
            sin = sin[0].clone()
            sin[:, : self.D // 2].neg_()
            self._rope = torch.stack([cos[0], sin], dim=1).contiguous()
        return self._rope

    # ---- cache ---------------------------------------------------------------------------------

    def _cache(self, B: int, T: int) -> torch.Tensor:
        """A [layers, 2, B, Hk, D, T] view of the reusable KV buffer (grown when too small).

        Keys and values are stored transposed (a row's head is a [D, T] block,
        columns = cache positions): decode's score product ``q @ K`` then reads K
        untransposed and ``p @ V`` reads V as a transposed operand, the two
        orientations in which one-thread BLAS runs these skinny (G-row) products
        fastest (measured: 68 + 77 us per tiny-model layer at batch 32 and 210
        columns, vs 86 + 143 us with [T, D] blocks).
        """
        pool = self._pool
        if pool is None or pool.shape[2] < B or pool.shape[5] < T:
            b = max(B, pool.shape[2] if pool is not None else 0)
            t = -(-max(T, pool.shape[5] if pool is not None else 0) // 64) * 64
            self._pool = None  # free the old buffer first
            pool = self._pool = torch.zeros(
                self.n_layers, 2, b, self.Hk, self.D, t, device=self.device, dtype=self.dtype
            )
        return pool[:, :, :B, :, :, :T]

    def release(self) -> None:
        """Drop the reusable KV buffer (it is re-allocated on the next call)."""
        self._pool = None

    # ---- forward -------------------------------------------------------------------------------

    def _rot(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # HF's x*cos + rotate_half(x)*sin, rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * (-1 | +1)
        # with the sign folded into the table's sin row (`_rope_rows`)
        return torch.addcmul(x * cos, x.roll(self.D // 2, -1), sin)

    def _head_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self._head(F.rms_norm(x, (self.H,), self._norm, self.eps))

    def _forward_block(
        self, ids: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor, col0: int, mask: torch.Tensor
    ) -> torch.Tensor:
        """Prefill-style forward of ids [B, L] at positions [B, L], writing cache columns
        ``col0 .. col0+L-1``; `mask` [B, 1, L, col0+L] additive. Returns the last hidden states [B, H]."""
        B, L = ids.shape
        Hq, Hk, D, H = self.Hq, self.Hk, self.D, self.H
        cs = self._rope_rows(int(pos.max()) + 1)[pos]  # [B, L, 2, D]
        cos, sin = cs[:, :, None, 0], cs[:, :, None, 1]
        x = F.embedding(ids, self._embed)
        end = col0 + L
        for li, w in enumerate(self._layers):
            h = F.rms_norm(x, (H,), w.ln1, self.eps)
            qkv = w.qkv(h).view(B, L, Hq + 2 * Hk, D)
            qk, v = qkv[:, :, : Hq + Hk], qkv[:, :, Hq + Hk :]
            if w.qk_norm is not None:
                qk = F.rms_norm(qk, (D,), None, self.eps) * w.qk_norm
            qk = self._rot(qk, cos, sin).transpose(1, 2)  # [B, Hq+Hk, L, D]
            kc, vc = kv[li, 0], kv[li, 1]  # [B, Hk, D, T]
            kc[..., col0:end] = qk[:, Hq:].transpose(2, 3)
            vc[..., col0:end] = v.permute(0, 2, 3, 1)
            # [T, D] copies for SDPA (it runs ~1.6x slower on the transposed views); small next to its work
            kt, vt = kc[..., :end].transpose(2, 3).contiguous(), vc[..., :end].transpose(2, 3).contiguous()
            att = F.scaled_dot_product_attention(qk[:, :Hq], kt, vt, attn_mask=mask, enable_gqa=self.G > 1, scale=1.0)
            x = x.add_(w.o(att.transpose(1, 2).reshape(B, L, Hq * D)))
            h = F.rms_norm(x, (H,), w.ln2, self.eps)
            g, u = w.gu(h).chunk(2, dim=-1)
            x = x.add_(w.down(F.silu(g, inplace=True).mul_(u)))  # in place: big activations
        return x[:, -1]

    def prefill(
        self, prompts: list[list[int]], max_new_tokens: int, min_shared_prefix: int = 32, pad_id: int = 0
    ) -> tuple[torch.Tensor, DecodeState]:
        """Run the prompts into a fresh cache sized for `max_new_tokens` more tokens.

        The prompts' longest common prefix (when at least `min_shared_prefix`
        tokens: a harness's system message) runs once and its cache column block
        is copied to every row; then each group of rows sharing at least
        `min_shared_prefix` more tokens (`_groups`: a GRPO group's prompts) runs
        its group prefix once; the rest runs left-padded, in chunks of
        consecutive rows of at most ``prefill_chunk_tokens`` tokens, each padded
        to its own longest prompt (rows end in the same cache column). Padding is
        hidden by the attention bias; positions count real tokens only, so a
        row's result does not depend on the batch.

        Returns:
            (logits [B, V] of each prompt's last token, the `DecodeState`).
        """
        dev, B = self.device, len(prompts)
        shared = 0
        if B > 1:
            shortest = min(map(len, prompts))
            first = prompts[0]
            while shared < shortest - 1 and all(p[shared] == first[shared] for p in prompts):
                shared += 1
            if shared < min_shared_prefix:
                shared = 0
        rest = [p[shared:] for p in prompts]
        L = max(map(len, rest))
        T = shared + L + max_new_tokens
        kv = self._cache(B, T)
        neg = torch.finfo(self.dtype).min
        if shared:
            ids = torch.tensor([prompts[0][:shared]], device=dev)
            pos = torch.arange(shared, device=dev)[None]
            causal = torch.full((shared, shared), neg, device=dev, dtype=self.dtype).triu(1)[None, None]
            self._forward_block(ids, pos, kv[:, :, :1], 0, causal)
            kv[:, :, 1:, ..., :shared] = kv[:, :, :1, ..., :shared]
        # rows sharing a longer prefix among themselves (a GRPO group's prompts) prefill it once:
        # row layout [shared][group prefix][pad...][own suffix]
        group = [0] * B
        for rows, P in self._groups(rest, min_shared_prefix):
            ids = torch.tensor([rest[rows[0]][:P]], device=dev)
            pos = torch.arange(shared, shared + P, device=dev)[None]
            cols = torch.arange(shared + P, device=dev)
            see = cols[None] <= (shared + torch.arange(P, device=dev))[:, None]
            mask = torch.zeros(see.shape, device=dev, dtype=self.dtype).masked_fill_(~see, neg)[None, None]
            self._forward_block(ids, pos, kv[:, :, rows[0] : rows[0] + 1], shared, mask)
            others = torch.tensor(rows[1:], device=dev)
            kv[:, :, others, :, :, shared : shared + P] = kv[:, :, rows[0] : rows[0] + 1, ..., shared : shared + P]
            for r in rows:
                group[r] = P
        suffix = [r[g:] for r, g in zip(rest, group)]
        ids = torch.full((B, L), pad_id, dtype=torch.long)
        real = torch.ones((B, shared + L), dtype=torch.bool)
        for i, r in enumerate(suffix):
            ids[i, L - len(r) :] = torch.tensor(r)
            real[i, shared + group[i] : shared + L - len(r)] = False
        ids, real = ids.to(dev), real.to(dev)
        pos_all = (real.cumsum(-1) - 1).clamp(min=0)
        cols = torch.arange(shared + L, device=dev)
        hidden = []
        for r0, r1 in self._chunks([len(r) for r in suffix], [L - g for g in group]):
            Lc = max(len(r) for r in suffix[r0:r1])
            c0 = shared + L - Lc  # this chunk's rows hold their own tokens only in columns >= c0
            # query i (cache column c0+i) sees earlier real columns and itself (so a pad query never
            # has an empty row: its output is discarded anyway); unwritten columns hold finite
            # stale values (the buffer starts zeroed) and are masked
            qcol = (c0 + torch.arange(Lc, device=dev))[:, None]
            see = (cols[None] <= qcol)[None] & (real[r0:r1, None, :] | (cols[None] == qcol)[None])
            mask = torch.zeros(see.shape, device=dev, dtype=self.dtype).masked_fill_(~see, neg)[:, None]
            hidden.append(self._forward_block(ids[r0:r1, L - Lc :], pos_all[r0:r1, c0:], kv[:, :, r0:r1], c0, mask))
        hidden = torch.cat(hidden)
        bias = torch.zeros((B, 1, 1, T), device=dev, dtype=self.dtype)
        bias[:, 0, 0, : shared + L].masked_fill_(~real, float("-inf"))
        return self._head_logits(hidden), DecodeState(kv, bias, pos_all[:, -1] + 1, shared + L, shared)

    @staticmethod
    def _groups(rest: list[list[int]], min_prefix: int) -> list[tuple[list[int], int]]:
        """Rows whose prompts share at least `min_prefix` more tokens: [(row indices, shared length)].

        Rows are sorted by content; consecutive rows join a group while their
        common prefix with its first row stays >= `min_prefix`; a group's prefix
        leaves every row at least one token of its own.
        """

        def lcp(a: list[int], b: list[int]) -> int:
            n = min(len(a), len(b))
            k = 0
            while k < n and a[k] == b[k]:
                k += 1
            return k

        order = sorted(range(len(rest)), key=lambda i: rest[i])
        out, cur, P = [], [order[0]], 0
        for i in order[1:]:
            k = min(lcp(rest[cur[0]], rest[i]), P) if len(cur) > 1 else lcp(rest[cur[0]], rest[i])
            if k >= min_prefix:
                cur.append(i)
                P = k
                continue
            if len(cur) > 1:
                out.append((cur, min(P, min(len(rest[r]) for r in cur) - 1)))
            cur, P = [i], 0
        if len(cur) > 1:
            out.append((cur, min(P, min(len(rest[r]) for r in cur) - 1)))
        return [(rows, p) for rows, p in out if p >= min_prefix]

    def _chunks(self, lengths: list[int], limits: list[int] | None = None) -> list[tuple[int, int]]:
        """Consecutive row ranges of at most ``prefill_chunk_tokens`` padded tokens each (callers
        sort rows by length, so a chunk's rows pad to their own longest prompt, not the batch's).

        A chunk writes its padded width into every row's cache, so its longest row must not exceed
        any member's `limits` entry (the columns left of a row's own tokens that hold its group
        prefix must not be overwritten).
        """
        limits = limits or [max(lengths)] * len(lengths)
        out, r0, longest, room = [], 0, 0, 1 << 62
        for r, n in enumerate(lengths):
            longest, room = max(longest, n), min(room, limits[r])
            if r > r0 and ((r + 1 - r0) * longest > self.prefill_chunk_tokens or longest > room):
                out.append((r0, r))
                r0, longest, room = r, n, limits[r]
        out.append((r0, len(lengths)))
        return out

    def _cascade(
        self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, S: int, T: int, bias_s: torch.Tensor
    ) -> torch.Tensor:
        """Decode attention with a shared prefix read once (cascade attention).

        q [B, Hk, G, D] (already scaled by D^-1/2); caches [B, Hk, D, T'] whose
        columns ``< S`` are equal in every row; `bias_s` [B, 1, 1, T-S] masks the
        per-row suffix. The prefix scores are one matmul per kv head over all
        B*G queries against row 0's prefix (read once, not B times), the suffix
        scores a batched matmul per row; one softmax over both, then the two
        value products are summed. Returns [B, Hk, G, D].
        """
        B, Hk, G, D = q.shape
        sp = torch.matmul(q.transpose(0, 1).reshape(Hk, B * G, D), kc[0, :, :, :S])  # [Hk, B*G, S]
        ss = torch.matmul(q, kc[..., S:T]).add_(bias_s)  # [B, Hk, G, T-S]
        p = torch.cat([sp.view(Hk, B, G, S).transpose(0, 1), ss], -1).softmax(-1)
        out = torch.matmul(p[..., S:], vc[..., S:T].transpose(2, 3))  # [B, Hk, G, D]
        pp = p[..., :S].transpose(0, 1).reshape(Hk, B * G, S)
        return out.add_(torch.matmul(pp, vc[0, :, :, :S].transpose(1, 2)).view(Hk, B, G, D).transpose(0, 1))

    def decode(self, tokens: torch.Tensor, st: DecodeState) -> torch.Tensor:
        """One step: feed tokens [B] (one per row), write cache column ``st.t``; returns logits [B, V]."""
        B, t = tokens.shape[0], st.t
        Hq, Hk, G, D, H = self.Hq, self.Hk, self.G, self.D, self.H
        cs = self._rope_rows(t + 1)[st.pos]  # [B, 2, D]
        cos, sin = cs[:, None, 0], cs[:, None, 1]
        S = st.shared
        bias = st.bias[..., : t + 1]
        x = F.embedding(tokens, self._embed)
        kv = st.kv
        for li, w in enumerate(self._layers):
            h = F.rms_norm(x, (H,), w.ln1, self.eps)
            qkv = w.qkv(h).view(B, Hq + 2 * Hk, D)
            qk = qkv[:, : Hq + Hk]
            if w.qk_norm is not None:
                qk = F.rms_norm(qk, (D,), None, self.eps).mul_(w.qk_norm)
            qk = self._rot(qk, cos, sin)
            kc, vc = kv[li, 0], kv[li, 1]  # [B, Hk, D, T]
            kc.select(3, t).copy_(qk[:, Hq:])
            vc.select(3, t).copy_(qkv[:, Hq + Hk :])
            q = qk[:, :Hq].view(B, Hk, G, D)  # the G query heads of a kv head are G query rows
            if S and self.cascade:
                att = self._cascade(q, kc, vc, S, t + 1, bias[..., S:])
            else:  # products on the cache's own layout (SDPA would copy the transposed views)
                att = torch.matmul(
                    torch.matmul(q, kc[..., : t + 1]).add_(bias).softmax(-1), vc[..., : t + 1].transpose(2, 3)
                )
            x = x.add_(w.o(att.reshape(B, Hq * D)))
            h = F.rms_norm(x, (H,), w.ln2, self.eps)
            g, u = w.gu(h).chunk(2, dim=-1)
            x = x.add_(w.down(F.silu(g, inplace=True).mul_(u)))
        st.t += 1
        st.pos = st.pos + 1
        return self._head_logits(x)
