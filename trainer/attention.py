"""Attention over a packed row's blocks, with no [T x T] mask: each block is one SDPA call.

A packed row (`ruler_rl.trainer.packing.Row`) holds blocks: plain sequences, or a shared prefix and its suffixes. Given
as a 4-D mask, such a row makes SDPA run its masked kernel over the whole T x T square, although most of it is
masked out (two 7.7k-token sequences in one row: three quarters of the square), and no causal kernel can take
it. Here each block instead attends on its own: a block with no parent runs SDPA's causal kernel over its own
tokens; a suffix attends to its prefix's keys and values followed by its own, causal with the diagonal aligned
to the end (`torch.nn.attention.bias.causal_lower_right`, which SDPA runs with its flash or memory-efficient
kernels). The outputs are the blocks' in row order. The sum is the mask's attention exactly: a token sees the
earlier tokens of its own block and, in a suffix, the whole prefix (`Row.attention_mask`).

The model keeps this as its attention implementation (`BLOCK_ATTENTION`, registered with transformers'
`AttentionInterface`): with no `ruler_blocks` argument it is transformers' own SDPA with the same masks, so
generation and plain forwards are unchanged. The blocks travel as a keyword argument of the model's forward, so
gradient checkpointing's recomputation sees them too. A suffix's keys and values are a copy of its prefix's and
its own (the KV heads repeated, as SDPA's masked path also does): `Row.block_copy_tokens` counts the prefix
tokens copied, and a row whose copies would hold more elements than its mask is given the mask instead
(`use_blocks`), so the memory plan, which counts the mask, stays an upper bound.
"""

from __future__ import annotations

import contextlib
import contextvars

BLOCK_ATTENTION = "sdpa_blocks"
_skip_mask = contextvars.ContextVar("ruler_skip_mask", default=False)


def _attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                       ruler_blocks=None, **kwargs):
    """transformers' attention function signature: query [B, Hq, T, D], key/value [B, Hkv, T, D]; returns
    ([B, T, Hq, D], None). `ruler_blocks`: (start, end, parent_start, parent_end) per block in row order
    (parent -1, -1: none); without it, transformers' SDPA."""
    import torch
    from torch.nn.attention.bias import causal_lower_right
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if ruler_blocks is None:
        if _skip_mask.get():  # a block row's forward, but this layer lost the blocks: it would attend across them
            raise RuntimeError(f"{type(module).__name__} was called without the row's blocks inside a block-row "
                               "forward: this model does not pass its forward's keyword arguments to its attention; "
                               "set ModelConfig(block_attention=False)")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"block attention takes a row of batch size 1, got {query.shape[0]}")
    unsupported = [k for k in ("softcap", "s_aux", "sliding_window", "position_bias") if kwargs.get(k) is not None]
    if attention_mask is not None or kwargs.get("is_causal") is False:
        unsupported.append("attention_mask" if attention_mask is not None else "is_causal=False")
    if unsupported:  # what transformers' SDPA would apply or refuse: the blocks alone would ignore it
        raise ValueError(f"block attention does not apply {', '.join(unsupported)} given by "
                         f"{type(module).__name__}: set ModelConfig(block_attention=False)")
    groups = query.shape[1] // key.shape[1]
    outs = []
    for start, end, p_start, p_end in ruler_blocks:
        q = query[:, :, start:end]
        if p_start < 0:
            k, v = key[:, :, start:end], value[:, :, start:end]
            mask, causal = None, True
        else:
            k = torch.cat([key[:, :, p_start:p_end], key[:, :, start:end]], dim=2)
            v = torch.cat([value[:, :, p_start:p_end], value[:, :, start:end]], dim=2)
            mask, causal = causal_lower_right(end - start, k.shape[2]), False
        if groups > 1:
            k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                               dropout_p=dropout, scale=scaling)
        outs.append(out)
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _mask(*args, **kwargs):
    """transformers' SDPA mask, or none while a block row runs forward (`blocks_forward`): the blocks are the
    mask, and transformers would otherwise build a [T x T] one from the row's position ids."""
    from transformers.masking_utils import sdpa_mask

    return None if _skip_mask.get() else sdpa_mask(*args, **kwargs)


def register() -> str:
    """Register `BLOCK_ATTENTION` with transformers (attention and mask functions); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(BLOCK_ATTENTION, _attention_forward)
    AttentionMaskInterface.register(BLOCK_ATTENTION, _mask)
    return BLOCK_ATTENTION


def enable(model) -> bool:
    """Switch a transformers model that uses SDPA to `BLOCK_ATTENTION` (the same SDPA, plus block rows); True if
    it now uses it. Any other implementation (eager, flash) is left as it is."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    current = getattr(base.config, "_attn_implementation", None)
    if current == BLOCK_ATTENTION:
        return True
    if current != "sdpa" or not hasattr(base, "set_attn_implementation"):
        return False
    base.set_attn_implementation(register())
    return getattr(base.config, "_attn_implementation", None) == BLOCK_ATTENTION


def use_blocks(row, q_width: int) -> bool:
    """Whether `row` runs as blocks rather than with its 4-D mask: the suffixes' copied prefix keys and values
    (2 x copied tokens x `q_width`, the query heads' width, as the KV heads are repeated) hold no more elements
    than the [T x T] mask the memory plan counts (transformers' additive copy of it)."""
    if isinstance(q_width, bool) or not isinstance(q_width, int) or q_width < 1:
        raise ValueError(f"q_width must be an int >= 1, got {q_width!r}")
    return 2 * row.block_copy_tokens() * q_width <= len(row) ** 2


@contextlib.contextmanager
def blocks_forward():
    """Around a model forward given `ruler_blocks`: transformers builds no mask for it."""
    token = _skip_mask.set(True)
    try:
        yield
    finally:
        _skip_mask.reset(token)
