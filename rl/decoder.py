"""The policy server's key/value cache (`Slots`) and the forward passes over it: transformers' own
modules through a `Cache` that writes into it, or for llama-shaped causal LMs (llama, mistral, qwen2)
`Decoder`: one step of the whole batch in few, large operations, on the only copy of the weights
the server keeps.

- **Fused projections.** Per layer, q/k/v are one matmul and gate/up another; the output and down
  projections add their residual in the matmul.
- **Packed weights.** In fp32 every projection and the output head run as oneDNN matmuls on weights
  reordered once for them (`torch.ops.mkldnn._linear_pointwise`), dense tensors in, dense out. The
  transformers modules' own weights are dropped: the packed ones are the model. Only a tied output
  head is held twice (the embedding lookup needs the table dense, the head packed).
- **Attention** is one `scaled_dot_product_attention` per layer over the engine's key/value slots
  (`Slots`: rows × columns, left-padded), the new keys and values written in place. A head of
  tokens every row shares (an RL group's prompt) is held once: each layer attends to it and to
  the rows' own columns in two passes, merged by their log-sum-exp (`_attend`). A prefill with no
  padded row needs no mask: its new tokens attend causally among themselves and whole to the columns
  before them (a prompt's cached head). In fp32 with heads of 64 or 128 that is one pass of our own
  kernel (rl/_kernels.c, built by the install: `_causal`), 3.5-3.7 ms a layer for SmolLM2's
  1k-token prompt on 2 cores against torch's 9.1-9.4 (AVX-512; on a CPU with AVX2 alone, 9.5-9.8
  against 13.4). Without it, torch's: two passes merged the same way, or after a head at most an
  eighth of the new tokens (a chat template's first block), one causal pass over all the columns, the
  head's columns given zero queries whose rows are dropped.
- **Elementwise steps** (RMSNorm; the rotary embedding, turning q and k in place and copying k and v
  into the slots; SiLU times the up projection) are one pass each of rl/_kernels.c in fp32, where
  torch's ops take two to five (`_rms_norm`, `_rotate`, `_silu_mul`).

It computes what transformers' LlamaDecoderLayer computes (its RMSNorm, rotary embedding, SDPA),
in another order of float additions: results differ by rounding (~1e-6), as another batch would."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

class Slots:
    """Per layer, key and value buffers [rows, kv_heads, columns, head_dim]. Rows 0..n-1 are in use
    and all end at column `t`; row r's tokens are columns start[r]..t-1, the columns before it padding
    (zeros: attention reads them, masked). Columns at t and beyond, and rows from n, are unused room.
    Every row's tokens may follow a shared `head` of tokens, whose keys and values are held once
    (`head_k`, `head_v`: per layer [1, kv_heads, len(head), head_dim]; `share`)."""

    def __init__(self, layers: int, heads: int, dim: int, dtype: torch.dtype, rows: int = 1, cols: int = 64):
        self.shape = (heads, dim)
        self.dtype = dtype
        self.k = [torch.empty(rows, heads, cols, dim, dtype=dtype) for _ in range(layers)]  # unused room: not
        self.v = [torch.empty(rows, heads, cols, dim, dtype=dtype) for _ in range(layers)]  # written, not resident
        self.n = 0
        self.t = 0
        self.start: list[int] = []
        self.head: list[int] = []
        self.head_k: list[torch.Tensor] = []
        self.head_v: list[torch.Tensor] = []

    @property
    def capacity(self) -> tuple[int, int]:
        return self.k[0].shape[0], self.k[0].shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held: each buffer's whole storage, once (a head shared as views holds the buffers it views)."""
        storages = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes()
                    for b in self.k + self.v + self.head_k + self.head_v}
        return sum(storages.values())

    def reserve(self, rows: int, cols: int, shift: int = 0) -> None:
        """Room for `rows` rows and `cols` columns; `shift` moves every row's columns right by that much."""
        have_rows, have_cols = self.capacity
        if rows <= have_rows and cols <= have_cols and shift == 0:
            return
        rows, cols = max(rows, have_rows), max(cols, have_cols)
        if cols > have_cols:
            cols = max(cols, have_cols * 5 // 4)
        if rows > have_rows:
            rows = max(rows, have_rows * 2)
        self._move(rows, cols, shift)

    def _move(self, rows: int, cols: int, shift: int = 0) -> None:
        """New buffers of rows x cols with the rows in use copied over (`shift` columns to the right; to
        the left, dropping as many, where it is negative). Their unused room is never written, so the
        pages of a large one stay untouched (not resident)."""
        n, t = self.n, self.t
        for bufs in (self.k, self.v):
            for i, old in enumerate(bufs):
                new = torch.empty(rows, self.shape[0], cols, self.shape[1], dtype=self.dtype)
                new[:n, :, : max(shift, 0)] = 0
                new[:n, :, max(shift, 0) : shift + t] = old[:n, :, max(-shift, 0) : t]
                bufs[i] = new
        self.t += shift
        self.start = [s + shift for s in self.start]

    def add(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
        """A new row from one sequence's keys and values (per layer [kv_heads, length, head_dim]); its index."""
        length = keys[0].shape[1]
        if self.n == 0:
            self.t = 0
        shift = max(0, length - self.t)
        self.reserve(self.n + 1, self.t + shift + 1, shift)
        r, lo = self.n, self.t - length
        for layer, (k, v) in enumerate(zip(keys, values)):
            self.k[layer][r, :, :lo] = 0
            self.v[layer][r, :, :lo] = 0
            self.k[layer][r, :, lo : self.t] = k
            self.v[layer][r, :, lo : self.t] = v
        self.start.append(lo)
        self.n += 1
        return r

    def remove(self, r: int) -> None:
        """Drop row r: the last row moves into its place. Padding nobody needs moves out, and half-unused
        buffers shrink (an empty batch keeps one small row)."""
        last = self.n - 1
        if r != last:
            for bufs in (self.k, self.v):
                for b in bufs:
                    b[r, :, : self.t] = b[last, :, : self.t]
            self.start[r] = self.start[last]
        self.start.pop()
        self.n -= 1
        if not self.n:
            self.t = 0
            self.head, self.head_k, self.head_v = [], [], []
            if self.capacity != (1, 64):
                self._move(1, 64)
            return
        m = min(self.start)
        if m > max(256, self.t // 4):  # move left
            for bufs in (self.k, self.v):
                for b in bufs:
                    b[: self.n, :, : self.t - m] = b[: self.n, :, m : self.t].clone()
            self.t -= m
            self.start = [s - m for s in self.start]
        rows, cols = self.capacity
        if rows * cols >= 2 * max(self.n * (self.t + 64), 64):
            self._move(self.n, self.t + 64)

    def share(self, head: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Hold `head` once, its keys and values the first len(head) columns of `keys` and `values` (per
        layer [kv_heads, length, head_dim]: those tensors themselves, not a copy; nothing else may write
        them): the rows in use begin with it, and give up their own copy."""
        p = len(head)
        self.head = list(head)
        self.head_k = [k[None, :, :p] for k in keys]
        self.head_v = [v[None, :, :p] for v in values]
        if self.n:
            self.start = [s + p for s in self.start]
            m = min(self.start)
            self._move(self.capacity[0], self.t - m + 64, -m)

    def unshare(self) -> None:
        """Write the head back into every row in use, before its own columns (a row without it joins)."""
        p = len(self.head)
        if p:
            shift = max(0, p - min(self.start, default=p))
            self.reserve(self.n, self.t + shift, shift)
            for layer, (k, v) in enumerate(zip(self.k, self.v)):
                for r, s in enumerate(self.start):
                    k[r, :, s - p : s] = self.head_k[layer][0]
                    v[r, :, s - p : s] = self.head_v[layer][0]
            self.start = [s - p for s in self.start]
            self.head, self.head_k, self.head_v = [], [], []

    def row(self, r: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Row r's keys and values, per layer [kv_heads, length, head_dim] (views)."""
        lo = self.start[r]
        return [k[r, :, lo : self.t] for k in self.k], [v[r, :, lo : self.t] for v in self.v]

    def cache(self, new: int) -> Cache:
        """The transformers cache for a forward pass that appends `new` columns to rows 0..n-1."""
        self.reserve(self.n, self.t + new)
        return Cache(layers=[_SlotLayer(self, i) for i in range(len(self.k))])

    def mask(self, new: int) -> torch.Tensor:
        """[n, 1, new, t+new] bool: each row attends to its own tokens, causally over the new ones; a
        padding column's query attends to itself alone (all masked would make NaNs that spread)."""
        cols = torch.arange(self.t + new)
        own = cols[None, :] >= torch.tensor(self.start)[:, None]  # [n, T]
        here = (self.t + torch.arange(new))[:, None]  # [new, 1]: each new column
        return ((own[:, None, :] & (cols[None, :] <= here)[None]) | (cols[None, :] == here)[None])[:, None]


class _SlotLayer(CacheLayerMixin):
    """One layer of `Slots` as transformers' attention sees it: writes the new keys and values in
    place at columns t.. and returns every column so far. The owner moves `t` after the pass."""

    is_compileable = False

    def __init__(self, slots: Slots, layer: int):
        super().__init__()
        self.slots, self.layer = slots, layer
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        s, n, t = self.slots, self.slots.n, self.slots.t
        end = t + key_states.shape[2]
        k, v = s.k[self.layer], s.v[self.layer]
        k[:n, :, t:end] = key_states
        v[:n, :, t:end] = value_states
        return k[:n, :, :end], v[:n, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.slots.t + query_length, 0

    def get_seq_length(self) -> int:
        return self.slots.t

    def get_max_length(self) -> int:
        return -1



SUPPORTED = ("llama", "mistral", "qwen2")
"""Architectures whose decoder layers are exactly RMSNorm, rotary attention, RMSNorm, SiLU-gated MLP."""


def supports(model: nn.Module) -> bool:
    """Whether `model` (a transformers CausalLM) is one this module runs."""
    c = model.config
    return (c.model_type in SUPPORTED and getattr(c, "hidden_act", "silu") == "silu"
            and type(model.get_input_embeddings()) is nn.Embedding and hasattr(model.model, "rotary_emb"))


class _Linear:
    """x @ w.T + b (+ add), on a oneDNN-packed `w` where that is possible, else on the dense one."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None, batch: int):
        self.shape, self.dtype = tuple(w.shape), w.dtype
        self.packed = w.dtype == torch.float32 and torch.backends.mkldnn.is_available()
        self.w = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), batch) if self.packed else w.contiguous()
        self.b = None if b is None else b.contiguous()

    def __call__(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        if not self.packed:
            y = F.linear(x, self.w, self.b)
            return y if add is None else add + y
        if add is None:
            return torch.ops.mkldnn._linear_pointwise(x, self.w, self.b, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise(x, add, self.w, self.b, "add")

    def dense(self) -> torch.Tensor:
        return self.w.to_dense() if self.packed else self.w

    @property
    def nbytes(self) -> int:
        n = self.shape[0] * self.shape[1] + (0 if self.b is None else self.b.numel())
        return n * self.dtype.itemsize


class Decoder:
    """A llama-shaped model's weights, fused and packed, and its forward pass over the engine's slots.
    Made from the transformers model, whose decoder layers and head it then empties."""

    def __init__(self, model: nn.Module, batch: int = 16):
        c = model.config
        self.heads = c.num_attention_heads
        self.kv_heads = c.num_key_value_heads or c.num_attention_heads
        self.dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.hidden, self.eps, self.batch = c.hidden_size, c.rms_norm_eps, batch
        self.layers_n = c.num_hidden_layers
        self.rotary = model.model.rotary_emb
        self.scale = self.dim ** -0.5
        self.head_key = next(n for n, m in model.named_modules() if m is model.get_output_embeddings()) + ".weight"
        self.embed_key = next(n for n, m in model.named_modules() if m is model.get_input_embeddings()) + ".weight"
        self.tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        state = model.state_dict()
        self.keys = {k: v.shape for k, v in state.items()}
        """The weights' names and shapes under transformers' names: what `load` takes."""
        self.load(state)
        # the packed weights are the model now: the modules' own go
        model.model.layers = nn.ModuleList()
        model.model.embed_tokens.weight = nn.Parameter(torch.empty(0), requires_grad=False)
        model.get_output_embeddings().weight = nn.Parameter(torch.empty(0), requires_grad=False)
        for t in [*model.parameters(), *model.buffers()]:  # the final norm's: the weights may be views of
            t.data = t.data.clone()  # a memory-mapped file, which stays mapped (resident) while any is alive

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """New weights (transformers' names, this model's shapes: the engine checks them)."""
        def w(name: str) -> torch.Tensor:
            return state[name].detach()

        def b(*names: str) -> torch.Tensor | None:
            return torch.cat([w(n) for n in names]) if all(n in state for n in names) else None

        layers = []
        for i in range(self.layers_n):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            qkv = [f"{a}{x}_proj" for x in "qkv"]
            layers.append((
                w(p + "input_layernorm.weight").clone(),
                _Linear(torch.cat([w(n + ".weight") for n in qkv]), b(*(n + ".bias" for n in qkv)), self.batch),
                _Linear(w(a + "o_proj.weight"), b(a + "o_proj.bias"), self.batch),
                w(p + "post_attention_layernorm.weight").clone(),
                _Linear(torch.cat([w(m + "gate_proj.weight"), w(m + "up_proj.weight")]),
                        b(m + "gate_proj.bias", m + "up_proj.bias"), self.batch),
                _Linear(w(m + "down_proj.weight"), b(m + "down_proj.bias"), self.batch),
            ))
        self.layers = layers
        self.embed = w(self.embed_key).clone()
        self.norm = w("model.norm.weight").clone()
        self.head = _Linear(self.embed if self.tied else w(self.head_key), None, self.batch)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under transformers' names, dense (a LoRA adapter is merged into them)."""
        out = {self.embed_key: self.embed, "model.norm.weight": self.norm}
        q, kv = self.heads * self.dim, self.kv_heads * self.dim
        for i, (n1, qkv, o, n2, gu, down) in enumerate(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"], out[p + "post_attention_layernorm.weight"] = n1, n2
            for name, part in zip("qkv", qkv.dense().split([q, kv, kv])):
                out[f"{p}self_attn.{name}_proj.weight"] = part
            out[p + "self_attn.o_proj.weight"] = o.dense()
            gate, up = gu.dense().chunk(2)
            out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"], out[p + "mlp.down_proj.weight"] = \
                gate, up, down.dense()
            for name, lin, parts in ((p + "self_attn.", qkv, ("q", "k", "v")), (p + "mlp.", gu, ("gate", "up"))):
                if lin.b is not None:
                    for x, bias in zip(parts, lin.b.split([q, kv, kv] if len(parts) == 3 else [lin.shape[0] // 2] * 2)):
                        out[f"{name}{x}_proj.bias"] = bias
        out[self.head_key] = self.embed if self.tied else self.head.dense()
        return {k: v for k, v in out.items() if k in self.keys}

    @property
    def nbytes(self) -> int:
        """Bytes of weights held, the packed head of a tied model included."""
        norms = (self.norm.numel() + sum(l[0].numel() + l[3].numel() for l in self.layers)) * self.norm.element_size()
        linears = sum(x.nbytes for l in self.layers for x in (l[1], l[2], l[4], l[5])) + self.head.nbytes
        return norms + linears + self.embed.numel() * self.embed.element_size()

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor],
                values: list[torch.Tensor], t: int, mask: torch.Tensor,
                head: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None) -> torch.Tensor:
        """The final hidden state [n, hidden] of each row's last new token. `ids` and `positions` are
        [n, new]; per layer, keys and values [rows, kv_heads, columns, dim] get the new ones at columns
        t..t+new-1; `mask` [n, 1, new, t+new] (True: attend; None: causal, where no row is padded: the new
        tokens attend causally among themselves and whole to columns 0..t-1); `head`: per layer the keys and
        values [1, kv_heads, length, dim] of a head every row follows and attends to whole (`Slots.share`;
        not with a causal pass)."""
        n, new = ids.shape
        # with a shared head, the flash kernel takes an additive mask, one row per query of a kv head
        if mask is not None and head is not None:
            mask = torch.zeros(mask.shape, dtype=self.embed.dtype).masked_fill_(~mask, float("-inf"))
            mask = mask.repeat(1, 1, self.heads // self.kv_heads, 1)
        h_, kv, d, end = self.heads, self.kv_heads, self.dim, t + new
        h = F.embedding(ids.reshape(-1), self.embed)
        cos, sin = (c.contiguous() for c in self.rotary(h, positions))  # [n, new, dim]
        last = len(self.layers) - 1
        for i, ((n1, qkv, o, n2, gate_up, down), k_buf, v_buf) in enumerate(zip(self.layers, keys, values)):
            x = qkv(_rms_norm(h, n1, self.eps)).view(n, new, h_ + 2 * kv, d)
            q = _rotate(x, cos, sin, k_buf[:n], v_buf[:n], t, h_)[:, :, :h_].transpose(1, 2)
            if i == last and mask is None and new > 1:  # of the last layer only the last token's output is
                # asked for (its keys and values are in the slots): its query, output projection and MLP alone
                q, h, t, new = q[:, :, -1:], h.view(n, new, -1)[:, -1].contiguous(), end - 1, 1
            if mask is None:
                a = _causal(q, k_buf[:n, :, :end], v_buf[:n, :, :end], t, self.scale)
            elif head is None:
                a = F.scaled_dot_product_attention(q, k_buf[:n, :, :end], v_buf[:n, :, :end], attn_mask=mask,
                                                   scale=self.scale, enable_gqa=kv != h_)
            else:
                a = _attend(q, k_buf[:n, :, :end], v_buf[:n, :, :end], mask, head[0][i], head[1][i], self.scale)
            h = o(a.transpose(1, 2).reshape(n * new, h_ * d), add=h)
            h = down(_silu_mul(gate_up(_rms_norm(h, n2, self.eps))), add=h)
        return F.rms_norm(h.view(n, new, self.hidden)[:, -1], (self.hidden,), self.norm, self.eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] fp32 from final hidden states [rows, hidden]."""
        return self.head(h).float()


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, head_k: torch.Tensor,
            head_v: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of queries q [n, heads, new, dim] over a head of keys and values (head_k, head_v
    [1 or n, kv_heads, P, dim]: one every row shares, held once, or each row's own) and the rows' own
    keys and values k, v [n, kv_heads, T, dim], under an additive `mask` [n, 1, groups * new, T] (None:
    causal, T being `new`): one pass each, the two merged by their log-sum-exp, as attending to the
    head and the own columns together would be (up to rounding). A kv head's query heads go in one
    batch, and a shared head takes every row's queries in one: it is read once a layer, not once a row."""
    n, heads, new, d = q.shape
    kv = k.shape[1]
    grouped = q.reshape(n, kv, heads // kv * new, d)
    if mask is None:  # a kv head's query heads in one batch would not be causal: its keys go to each
        own, own_lse = _flash(q, k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1), 0.0,
                              True, scale=scale)
        own, own_lse = own.reshape(grouped.shape), own_lse.reshape(grouped.shape[:3])
    else:
        own, own_lse = _flash(grouped, k, v, 0.0, False, attn_mask=mask, scale=scale)
    if head_k.shape[0] == n:
        shared, shared_lse = _flash(grouped, head_k, head_v, 0.0, False, scale=scale)
    else:
        shared, shared_lse = _flash(grouped.transpose(0, 1).reshape(1, kv, -1, d), head_k, head_v, 0.0, False,
                                    scale=scale)
        shared, shared_lse = shared.view(kv, n, -1, d).transpose(0, 1), shared_lse.view(kv, n, -1).transpose(0, 1)
    w = torch.sigmoid(shared_lse - own_lse)[..., None].to(q.dtype)  # the head's share of each query's weight
    return (own + w * (shared - own)).reshape(n, heads, new, d)


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: int, scale: float) -> torch.Tensor:
    """Queries q [n, heads, new, dim] at columns t.. over keys and values k, v [n, kv_heads, t + new, dim],
    each query attending to the columns up to its own: [n, heads, new, dim]. By rl/_kernels.c on
    torch's threads where it runs (built, AVX-512 or AVX2, fp32, heads of 64 or 128), its result a view of
    [n, new, heads, dim], as the output projection takes it; else by torch's kernel."""
    n, heads, new, dim = q.shape
    if _native is not None and dim in (64, 128) and k.stride() == v.stride() \
            and all(x.dtype == torch.float32 and x.stride(-1) == 1 for x in (q, k, v)):
        out = torch.empty(n, new, heads, dim).transpose(1, 2)
        if _run("rl::causal_attention", _native.causal, q.data_ptr(), q.stride()[:3], k.data_ptr(), v.data_ptr(),
                k.stride()[:3], out.data_ptr(), out.stride()[:3], n, heads, k.shape[1], new, t, dim, scale,
                torch.get_num_threads()):
            return out
    grouped = k.shape[1] != heads
    if not t:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=grouped, is_causal=True)
    if t * 8 <= new:  # a short head before them: t zero queries first make one causal pass right (their rows
        # dropped), cheaper than a second pass and the merge
        q = torch.cat((q.new_zeros(n, heads, t, dim), q), 2)
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=grouped, is_causal=True)[:, :, t:]
    return _attend(q, k[:, :, t:], v[:, :, t:], None, k[:, :, :t], v[:, :, :t], scale)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of rows x [rows, width]: one pass of rl/_kernels.c (fp32, contiguous), else torch's."""
    if _native is not None and x.dtype == weight.dtype == torch.float32 and x.is_contiguous():
        out = torch.empty_like(x)
        if _run("rl::rms_norm", _native.rms_norm, x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0],
                x.shape[1], eps, torch.get_num_threads()):
            return out
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _silu_mul(g: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up from rows g [rows, 2 * inner] of both: one pass of rl/_kernels.c, else torch's."""
    rows, inner = g.shape[0], g.shape[1] // 2
    if _native is not None and g.dtype == torch.float32 and g.is_contiguous():
        out = g.new_empty(rows, inner)
        if _run("rl::silu_mul", _native.silu_mul, g.data_ptr(), out.data_ptr(), rows, inner, torch.get_num_threads()):
            return out
    return F.silu(g[:, :inner]) * g[:, inner:]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: int,
            heads: int) -> torch.Tensor:
    """The q/k/v projection's output x [n, new, heads + 2 kv_heads, dim] with its query and key heads turned by
    the rotary embedding (cos, sin [n, new, dim]); its keys and values written to columns t.. of the slots k, v
    [n, kv_heads, columns, dim]. rl/_kernels.c does it in place, in one pass; else torch's ops."""
    n, new, width, dim = x.shape
    kv = (width - heads) // 2
    if _native is not None and x.dtype == k.dtype == torch.float32 and x.is_contiguous() and k.stride() == v.stride() \
            and k.stride(-1) == 1 and _run("rl::rotary", _native.rotate, x.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                           k.data_ptr(), v.data_ptr(), k.stride()[:3], n, new, heads, kv, dim, t,
                                           torch.get_num_threads()):
        return x
    half, cos, sin = dim // 2, cos[:, :, None], sin[:, :, None]  # the same for every head
    qk = x[:, :, : heads + kv]
    qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin
    k[:, :, t : t + new] = qk[:, :, heads:].transpose(1, 2)
    v[:, :, t : t + new] = x[:, :, heads + kv :].transpose(1, 2)
    return qk


def _run(name: str, kernel, *args) -> bool:
    """A kernel of rl/_kernels.c, named in a profile (bench/prefill.py) when one records and the kernels run."""
    if torch.autograd._profiler_enabled() and _native.isa():
        with torch.profiler.record_function(name):
            return kernel(*args)
    return kernel(*args)


try:
    from rl import _kernels as _native
except ImportError:  # built by the install where a C compiler was found (pyproject.toml)
    _native = None


def kernels() -> str:
    """Whose kernels run a prefill's attention and a layer's elementwise steps, and on what (`prime-agent rl
    serve` says it as it starts)."""
    if _native is None:
        return "torch's (rl/_kernels.c was not built: no C compiler at install)"
    if _native.isa():
        return f"rl/_kernels.c ({_native.isa()})"
    if _native.supported():
        return "torch's (rl/_kernels.c set aside)"
    return "torch's (this CPU has neither AVX-512 nor AVX2 with FMA for rl/_kernels.c)"

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
"""Scaled dot-product attention on the CPU that also returns each query's log-sum-exp."""
