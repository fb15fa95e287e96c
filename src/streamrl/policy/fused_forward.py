"""The engine's own decoder forward for Llama-family models (Llama, SmolLM2, Qwen2, Qwen3).

Transformers' layer code spends many small ops per layer (separate q/k/v and gate/up matrix
multiplies, rotary applied to q and k apart, module calls), a large share of a step at the
engine's CPU shapes (64 one-token rows, or one prefill group). ``FusedDecoder`` computes the same
function with one matrix multiply for q/k/v and one for gate/up, rotary on q and k together, and the
engine's cache protocol (``update``) and attention (``engine_attention``) as transformers' layers
use them. In the last layer of a multi-token forward only the last position goes on past the K/V
write (the engine takes logits there only), so the returned hidden states are then ``[B, 1, H]``.

The fused weights are the model's own storage: each layer's q/k/v and gate/up projection
parameters are re-pointed at row blocks of one tensor. ``load_state_dict`` (``update_weights``)
copies into parameters in place, so new weights reach the fused tensors, and no weight is held
twice. Every projection's weight (o, down and the output head too, an embedding tied to the head
following it) is stored input-major (the transpose of
``nn.Linear``'s layout, the parameter a transposed view of it): ``F.linear`` then multiplies by a
contiguous ``[in, out]`` matrix, the same result 10-20% faster at the engine's 64-row shapes
(measured on the 2-core Xeon: SmolLM2 gate/up 2.9 -> 2.6 ms, down 1.6 -> 1.4 ms per layer). ``FusedDecoder.build`` returns None for any other structure (the engine then keeps
transformers' forward).

On CPU in float32 the output head also keeps a copy of its weight pre-packed in oneDNN's blocked
layout (``Projection``): a plain matrix multiply re-packs its weight on every call, which for the
vocabulary-wide head at the engine's 64-row decode shape costs about a quarter of its time (SmolLM2's
49,152 x 576 head on the 2-core AVX2 EPYC, quiet: 54 -> 70 GFLOP/s). The decoder's own projections
stay plain ``F.linear``: there packing measured no faster at 64 rows (71-76 GFLOP/s either way) and
slower at prefill sizes (80-83 against 90-95 at 1,700 rows), and the whole engine ran 6% faster
without it (docs/results/speed.md, seventh round). The head's copy is refreshed after
``update_weights`` (``FusedDecoder.refresh``); without oneDNN, or in other dtypes and devices,
``F.linear`` as before.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from streamrl.policy.dtype_choice import cpu_flags
from streamrl.policy.kv_cache import engine_attention
from streamrl.policy.modeling import decoder_and_head

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [B, Q, n, D]`` (query and key heads together), ``cos/sin [B, Q, D]``:
    transformers' ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


def input_major(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` with the same values, stored as a contiguous ``[in, out]`` (a transposed view)."""
    return weight.detach().t().contiguous().t()


def fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One ``(weight, bias)`` for ``linears`` that read the same input, their outputs side by side;
    each module's parameters become views of it (see the module docstring)."""
    weight = input_major(torch.cat([m.weight.detach() for m in linears]))
    bias = None if linears[0].bias is None else torch.cat([m.bias.detach() for m in linears])
    start = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            m.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias


#: the row count oneDNN lays the packed weights out for (the engine's usual decode batch)
PACKING_ROWS = 64
#: a projection is packed from this many outputs on (the vocabulary-wide head; module docstring)
PACK_MIN_OUTPUTS = 16384


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    """``weight [out, in]`` quantised to int8 per output row (symmetric scales) and packed for torch's
    dynamic int8 linear (fbgemm): activations are quantised per call, outputs come back float32."""
    weight = weight.detach().float().contiguous()
    scales = (weight.abs().amax(dim=1).clamp_min(1e-8) / 127.0).double()
    zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch marks its quantised tensors deprecated (still its fastest int8 path here)
        warnings.simplefilter("ignore")
        quantised = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(quantised, None if bias is None else bias.detach().float())


#: without VNNI, fbgemm's int8 products can saturate unless activations keep to 7 bits
REDUCE_RANGE = not {"avx512_vnni", "avx_vnni"} & cpu_flags()


def _can_pack(weight: torch.Tensor) -> bool:
    return (
        weight.shape[0] >= PACK_MIN_OUTPUTS
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )


class Projection:
    """``x -> x W^T + b`` over the model's own ``weight [out, in]`` (and ``bias``), through a copy of
    the weight pre-packed for oneDNN where that pays (module docstring); ``refresh`` re-packs it
    after the weight changed in place."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, int8: bool = False):
        self.weight, self.bias, self.int8 = weight, bias, int8
        self.packed: torch.Tensor | None = None
        #: the int8 copy (``int8``: quantised rollouts), or None
        self.quantised: Any = None
        self.refresh()

    def refresh(self) -> None:
        if self.int8:
            self.quantised = int8_linear(self.weight, self.bias)
            return
        if not _can_pack(self.weight):
            return
        try:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach().contiguous(), PACKING_ROWS)
        except (RuntimeError, AttributeError):  # a torch build without the op: F.linear
            self.packed = None

    @property
    def own_copy(self) -> bool:
        """Whether this projection multiplies by a copy of its own (packed or int8), not ``weight``."""
        return self.packed is not None or self.quantised is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantised is not None:
            return torch.ops.quantized.linear_dynamic(x, self.quantised, REDUCE_RANGE)
        # one row is a matrix-vector product, which MKL runs without packing (SmolLM2's head at one
        # row: 8.8 ms unpacked against 18.1 packed; from 2 rows packed is as fast or faster)
        if self.packed is None or x.numel() == x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class _Layer:
    """One decoder layer's modules and fused weights."""

    def __init__(self, layer: Any, int8: bool = False):
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        #: Qwen3's per-head RMSNorms (a model has both or neither), else None
        self.q_norm: Any = getattr(attn, "q_norm", None)
        self.k_norm: Any = getattr(attn, "k_norm", None)
        for linear in (attn.o_proj, mlp.down_proj):
            linear.weight = nn.Parameter(input_major(linear.weight), requires_grad=False)
        self.qkv = Projection(*fuse([attn.q_proj, attn.k_proj, attn.v_proj]), int8=int8)
        self.gate_up = Projection(*fuse([mlp.gate_proj, mlp.up_proj]), int8=int8)
        self.o_proj = Projection(attn.o_proj.weight, attn.o_proj.bias, int8=int8)
        # down_proj stays float32 under int8 rollouts: its input (silu(gate) * up) has outlier channels
        # that one activation scale per row cannot hold; quantised too, SmolLM2's behaviour KL against
        # the float policy was 0.22 nats a token, without it 0.066 (benchmarks/quantised_rollouts.py)
        self.down_proj = Projection(mlp.down_proj.weight, mlp.down_proj.bias)
        self.scaling = attn.scaling

    @property
    def projections(self) -> tuple[Projection, ...]:
        return self.qkv, self.o_proj, self.gate_up, self.down_proj


class FusedDecoder:
    """``decoder(input_ids, mask, positions, cache)`` -> last hidden states (module docstring)."""

    def __init__(self, decoder: Any, head: nn.Linear, int8: bool = False):
        config = decoder.config
        tied = decoder.embed_tokens.weight is head.weight
        head.weight = nn.Parameter(input_major(head.weight), requires_grad=False)
        if tied:
            decoder.embed_tokens.weight = head.weight
        self.embed, self.rotary, self.norm = decoder.embed_tokens, decoder.rotary_emb, decoder.norm
        self.layers = [_Layer(layer, int8) for layer in decoder.layers[: config.num_hidden_layers]]
        #: the output head's projection (the decode loop takes logits through it)
        self.head = Projection(head.weight, head.bias, int8=int8)
        self.head_dim = decoder.layers[0].self_attn.head_dim
        self.q_heads = config.num_attention_heads
        self.qk_heads = config.num_attention_heads + config.num_key_value_heads
        #: the block whose input each call keeps in ``captured`` ``[B, Q, H]`` (None: none kept)
        self.capture_layer: int | None = None
        self.captured: torch.Tensor | None = None

    @classmethod
    def build(cls, model: Any, int8: bool = False) -> FusedDecoder | None:
        """A fused forward over ``model``'s decoder, or None when its structure is not the one
        computed here (another model type, activation, norm or projection class, e.g. LoRA layers).
        ``int8``: the projections (the head included, ``down_proj`` excepted: see ``_Layer``) multiply
        by int8 copies of their weights."""
        decoder, head = decoder_and_head(model)
        config = decoder.config
        if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES or config.hidden_act != "silu":
            return None
        if type(head) is not nn.Linear or not all(hasattr(decoder, name) for name in ("embed_tokens", "rotary_emb", "norm", "layers")):
            return None
        for layer in decoder.layers[: config.num_hidden_layers]:
            attn, mlp = layer.self_attn, getattr(layer, "mlp", None)
            # a missing projection (None) fails the nn.Linear check before its bias is read
            groups: tuple[list[Any], list[Any]] = (
                [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")],
                [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")],
            )
            for group in groups:
                if any(type(m) is not nn.Linear for m in group) or len({m.bias is None for m in group[:-1]}) != 1:
                    return None
            norms = [layer.input_layernorm, layer.post_attention_layernorm]
            norms += [getattr(attn, name) for name in ("q_norm", "k_norm") if hasattr(attn, name)]
            if not all(type(n).__name__.endswith("RMSNorm") for n in norms):  # applied as modules
                return None
        return cls(decoder, head, int8)

    def __call__(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """``input_ids, positions [B, Q]``, bool ``mask [B, 1, Q, K]``, ``cache`` with transformers'
        ``update(key, value, layer)`` -> ``[B, Q, H]`` hidden states after the final norm
        (``[B, 1, H]``, the last position, when ``Q > 1``); the input of block ``capture_layer`` at
        every position goes to ``captured``."""
        batch, queries = input_ids.shape
        hidden = self.embed(input_ids)
        cos, sin = self.rotary(hidden, positions)
        for index, layer in enumerate(self.layers):
            if index == self.capture_layer:  # a new tensor each call: the residual adds are out of place
                self.captured = hidden
            qkv = layer.qkv(layer.input_norm(hidden)).view(batch, queries, -1, self.head_dim)
            qk, value = qkv[:, :, : self.qk_heads], qkv[:, :, self.qk_heads :]
            if layer.q_norm is not None:  # Qwen3: RMSNorm over each head before rotary
                q, k = qk[:, :, : self.q_heads], qk[:, :, self.q_heads :]
                qk = torch.cat((layer.q_norm(q), layer.k_norm(k)), dim=2)
            qk = rotate(qk, cos, sin).transpose(1, 2)
            key, value = cache.update(qk[:, self.q_heads :], value.transpose(1, 2), index)
            query, attend = qk[:, : self.q_heads], mask
            if index == len(self.layers) - 1 and queries > 1:  # only the last position is read
                query, attend, hidden = query[:, :, -1:], mask[:, :, -1:], hidden[:, -1:]
            out, _ = engine_attention(None, query, key, value, attend, layer.scaling)
            hidden = hidden + layer.o_proj(out.flatten(2))
            gate, up = layer.gate_up(layer.post_norm(hidden)).chunk(2, dim=-1)
            gate = F.silu(gate, inplace=True).mul_(up)  # in place: no [B, Q, I] temporaries
            hidden = hidden + layer.down_proj(gate)
        return self.norm(hidden)

    @property
    def projections(self) -> list[Projection]:
        """Every projection of the forward, the head last."""
        return [p for layer in self.layers for p in layer.projections] + [self.head]

    def refresh(self) -> None:
        """Re-pack the weights after they were changed in place (``load_state_dict``)."""
        for projection in self.projections:
            projection.refresh()
