"""A memory plan before the first step: from the model's `config.json`, the `ModelConfig` and the device's size,
whether rollouts and training fit on one device, and if not, what to change (issue #12).

    from ruler_rl.trainer.memory import plan_memory
    plan = plan_memory(ModelConfig(...), json.load(open("config.json")), device_bytes=80 * 2**30,
                       train=TrainConfig(max_tokens_per_micro_batch=16384))
    plan.fits, plan.message(), plan.rollout, plan.training        # named terms, in bytes

`LocalBackend.register` makes this plan on a CUDA device (or on any device when
`ModelConfig.memory_check.device_gib` is set) before it loads weights or starts vLLM, and raises
`MemoryPlanError` (a `MemoryError`) naming the numbers when it does not fit.

**It is an estimate**, from the architecture's shapes and what the trainer materialises, not a measurement. A
margin (`margin`, default 10 %) of the trainer's own terms is added as a term of its own for what is not
modelled: the caching allocator's fragmentation, kernels' workspaces (cuBLAS, attention), and the small
tensors of every layer. Checked on one H200 (torch 2.11, transformers 5.17, peft; random weights of the
Qwen2.5 shapes, LoRA r16 on all linear layers, SDPA with a 4-D mask, `torch.cuda.max_memory_allocated` over one
forward and backward pass): the activations term was within +0-2 % of the measured peak without checkpointing
(7B at 4k and 8k tokens: 37.1 and 75.5 GiB measured; 14B at 4k: 65.1 GiB) and +1-16 % with it (7B at 4k-32k:
2.6-22.2 GiB; 14B at 16k: 15.2 GiB), the larger excess at the shortest rows. The allocator reserved ~8 % above
what was allocated (the margin). Against the scale run (evals/reports/scale/README.md, vLLM at 0.45 / 0.55,
16,384-token micro-batches, checkpointing): whole-run peaks of 81.1 GiB (7B) and 108.1 GiB (14B) were
measured, the rollout phase is planned at 80.1 and 109.1 GiB of the H200's 139.8 GiB.

Two phases, each a sum of named terms that must fit the device (`device_bytes`):

- **rollout**: the trainer's resident state (CUDA context, base weights, LoRA parameters with their AdamW
  state: the optimizer keeps it between steps) plus, with vLLM colocated, vLLM's whole share
  (`EngineConfig.gpu_memory_utilization` x device: vLLM sizes its KV cache to fill it), plus memory other
  processes already use. vLLM's share must itself hold vLLM's copy of the weights, its overhead and the KV
  cache of one `max_model_len`-token sequence (vLLM refuses to start otherwise).
  With `ModelConfig.offload_during_rollouts` the trainer's base weights are in CPU memory in this phase
  (`ruler_rl.trainer.offload`): not counted.
- **training**: the trainer's resident state plus LoRA gradients and the activations of one forward/backward
  pass, plus what vLLM keeps while asleep. Assumption, from `trainer/vllm_server.py`: the colocated server
  sleeps at **level 1** around every step (`/sleep?level=1`): its weights are copied to CPU memory and its
  KV cache is dropped, so it keeps its CUDA context and the memory outside its sleep pool (CUDA graphs,
  allocator blocks), estimated at 1 GiB + 2 % of its share (the H200 run freed 61-63 GiB of a 62.9 GiB share
  at 7B, 76.5 of 76.9 GiB at 14B). Without sleep mode vLLM keeps its whole share while training. A
  dedicated placement keeps vLLM off the trainer's device (its share is checked against the inference device's
  own size: `inference_device_bytes`, at register `torch.cuda.mem_get_info` of the first inference GPU), unless
  it splits one GPU in two (`EngineConfig.shares_gpu`): then both phases of the trainer are checked against its
  own share, `trainer_memory_share` x device (the backend caps its allocator there), vLLM's against
  `gpu_memory_utilization` x device, and the two shares plus memory other processes already use against the
  whole device (so that a step fits beside vLLM, which also refuses to start when less than its share is free).
- **CPU memory** (`host_bytes`, at register the memory the OS reports available): the weight copies the run
  keeps on the host, both at once while a step trains: vLLM's weights while it sleeps at level 1 (vLLM keeps
  them in pinned memory), and with `offload_during_rollouts` the trainer's base weights (a pinned buffer
  allocated once and kept). At the 32B shape that is 2 x 61 GiB; the processes' own memory (Python, torch,
  CUDA libraries) is not counted.

What the trainer materialises in one pass (`trainer/training.py`, `trainer/packing.py`): a row of at most
`max(max_tokens_per_micro_batch, max_seq_length)` tokens (a sequence is never split; `prepare` truncates to
`EngineConfig.max_seq_length`), batch of one, in `ModelConfig.dtype` (bf16 on a GPU, fp32 on the CPU by default;
the byte counts below say 2 for bf16), LoRA weights in fp32 (peft
upcasts them), hence an fp32 copy of each adapted layer's input kept for the backward pass: counted although
under `TrainConfig.lora_autocast` (on by default for bf16 models) the adapters keep the bf16 input instead, so the
plan overstates those terms there (an upper bound; the 7B agent step's trainer peak fell 2.2 GiB with it on an
H200, `evals/reports/scale`). With SDPA or eager
attention the row's boolean [T x T] mask is passed as a 4-D attention mask: transformers then repeats the KV
heads (no GQA kernel with a mask) and torch's SDPA turns the mask into an additive one of the activations'
dtype, kept for the backward pass: T^2 x 2 bytes per layer without checkpointing, one layer's with it. The
plan counts the mask for every row, the worst case: a row of one sequence gets none (the model's own causal
mask, `ruler_rl.trainer.packing.Row.needs_mask`), and with block attention (`ruler_rl.trainer.attention`, the default
for SDPA) a packed row gets none either, its suffixes' copies of their prefix's keys and values taking the mask's place
only where they hold no more elements than it (`ruler_rl.trainer.attention.use_blocks`), so such rows need less than
planned. `flash_attention_2` takes no mask: one sequence per row, no T^2 term. Eager attention keeps each layer's
attention probabilities (T^2 x heads x 6 bytes). Frozen linear layers keep no input; SiLU and the gate product keep
three MLP-wide tensors. With gradient checkpointing each decoder layer keeps its input (T x hidden x 2 bytes) and one
layer is recomputed at a time; logprobs come from the last hidden state in chunks of `logprob_chunk_size` tokens, so
only a [chunk x vocabulary] block of logits exists at a time.

Left out: the full-logits fallback (`verify_logprob_path` failing: a row's [T x vocabulary] logits in the
model's dtype and their gradient, and a float32 copy of the trained positions' rows), the transformers
engine's generation KV cache (it generates with the trainer's weights, in the rollout phase), mixture-of-experts
and other non-Llama-like layers (refused), vision towers, LoRA dropout > 0 (peft then keeps an extra fp32 copy of
each adapted layer's dropped-out input for the backward pass), and a second model registered later on the same
device (memory already in use when the plan is made is counted). Quantised or CPU-offloaded weights (a
`quantization_config` in config.json, or `quantization` / `cpu_offload_gb` / ... in `EngineConfig.vllm_args`) are
not planned at all: `plan_memory` raises `ValueError` naming the setting, and `register` logs a warning and
registers without a plan (never refuses).

The plan assumes the micro-batch of `TrainConfig.max_tokens_per_micro_batch` that register is told of
(`ModelConfig.memory_check.max_tokens_per_micro_batch`; register never sees the steps' TrainConfig).
`LocalBackend.train` re-plans when a step's `TrainConfig.max_tokens_per_micro_batch` is larger: a warning naming
both numbers, or `MemoryPlanError` before the step when the re-plan does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ruler_rl.trainer.config import EngineConfig, ModelConfig, TrainConfig, vllm_flag_name

GIB = 2**30
CUDA_CONTEXT_BYTES = 1 * GIB       # the trainer's CUDA context, cuBLAS handles and kernels
VLLM_CONTEXT_BYTES = 1 * GIB       # vLLM's, while asleep
VLLM_SLEEP_SHARE = 0.02            # of vLLM's share, kept while asleep (CUDA graphs, blocks outside the pool)
VLLM_OVERHEAD_BYTES = 2 * GIB      # vLLM awake, beside weights and KV cache: context, CUDA graphs, activations
VLLM_OVERHEAD_SHARE = 0.02         # ... plus this fraction of its weights (LoRA buffers, larger activations)
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")
# vllm_args flags that shrink (quantise) or move (offload) vLLM's weights: the plan's bf16 copy would be wrong
WEIGHT_SHRINKING_FLAGS = ("quantization", "cpu_offload_gb", "kv_offloading_size", "offload_backend",
                          "offload_group_size", "offload_num_in_group", "qlora_adapter_name_or_path")
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


class MemoryPlanError(MemoryError):
    """The memory plan says the run does not fit the device; `plan` is the `MemoryPlan`, the message names the
    numbers and what to change."""

    def __init__(self, plan: MemoryPlan):
        super().__init__(plan.message())
        self.plan = plan

    def __reduce__(self):  # pickled whole (a trainer in a Ray actor raises it in the driver)
        return type(self), (self.plan,)


@dataclass(frozen=True)
class Shape:
    """The numbers of a decoder-only, Llama-like `config.json` that set memory."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool

    @property
    def q_out(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_out(self) -> int:
        return self.kv_heads * self.head_dim

    def parameters(self) -> int:
        """Embeddings, an untied lm_head, per layer q/k/v/o (GQA: k and v have `kv_heads`), the gated MLP and two
        RMS norms, and the final norm."""
        h = self.hidden
        attention = h * self.q_out + 2 * h * self.kv_out + self.q_out * h
        if self.qkv_bias:
            attention += self.q_out + 2 * self.kv_out
        layer = attention + 3 * h * self.intermediate + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h

    def linear_dims(self, name: str) -> tuple[int, int, int]:
        """(in, out, count) of the module a LoRA target name adapts; an unknown name is counted as one hidden x
        hidden linear per layer."""
        h, i = self.hidden, self.intermediate
        dims = {"q_proj": (h, self.q_out), "k_proj": (h, self.kv_out), "v_proj": (h, self.kv_out),
                "o_proj": (self.q_out, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        if name in dims:
            return (*dims[name], self.layers)
        if name in ("embed_tokens", "wte", "word_embeddings"):
            return self.vocab, h, 1
        if name == "lm_head":
            return h, self.vocab, 1
        return h, h, self.layers

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """vLLM's KV cache per token: K and V of every layer."""
        return self.layers * 2 * self.kv_out * dtype_bytes


def model_shape(hf_config: Mapping[str, Any]) -> Shape:
    """The `Shape` of a Hugging Face `config.json` dict (its `text_config` when the top level has no
    `hidden_size`). Missing keys, non-positive numbers and mixture-of-experts configs are a ValueError naming
    them. `num_key_value_heads` defaults to `num_attention_heads`, `head_dim` to hidden / heads, and
    `tie_word_embeddings` to False (the larger count)."""
    if not isinstance(hf_config, Mapping):
        raise TypeError(f"hf_config must be the model's config.json as a dict, got {type(hf_config).__name__}")
    cfg = hf_config
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        cfg = cfg["text_config"]
    missing = [k for k in _REQUIRED if cfg.get(k) is None]
    if missing:
        raise ValueError(f"hf_config lacks {', '.join(missing)}: the memory plan needs a decoder-only "
                         f"config.json with {', '.join(_REQUIRED)}")
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if (cfg.get(key) or 0) > 1:
            raise ValueError(f"hf_config is a mixture-of-experts model ({key}={cfg[key]}): the memory plan covers "
                             "dense Llama-like models only (set ModelConfig.memory_check=False to skip it)")
    numbers = {}
    for key in (*_REQUIRED, "num_key_value_heads", "head_dim"):
        value = cfg.get(key)
        if value is None and key in ("num_key_value_heads", "head_dim"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"hf_config[{key!r}] must be an int >= 1, got {value!r}")
        numbers[key] = value
    heads = numbers["num_attention_heads"]
    head_dim = numbers.get("head_dim") or numbers["hidden_size"] // heads
    if head_dim < 1:
        raise ValueError(f"hf_config: hidden_size {numbers['hidden_size']} / num_attention_heads {heads} gives no "
                         "head dimension; give head_dim")
    return Shape(hidden=numbers["hidden_size"], layers=numbers["num_hidden_layers"], heads=heads,
                 kv_heads=numbers.get("num_key_value_heads", heads), head_dim=head_dim,
                 intermediate=numbers["intermediate_size"], vocab=numbers["vocab_size"],
                 tied=bool(cfg.get("tie_word_embeddings", False)),
                 qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias", False)))


def lora_parameters(shape: Shape, rank: int, target_modules: list[str]) -> int:
    """Trainable parameters of a rank-`rank` LoRA on `target_modules`: r x (in + out) per adapted module."""
    return sum(rank * (d_in + d_out) * count
               for d_in, d_out, count in (shape.linear_dims(name) for name in dict.fromkeys(target_modules)))


def activation_bytes(shape: Shape, tokens: int, *, checkpointing: bool, targets: list[str], attention: str = "sdpa",
                     dtype_bytes: int = 2, logprob_chunk: int = 256) -> int:
    """Peak activation memory of one forward and backward pass over a row of `tokens` tokens (batch of one),
    as the module docstring describes: what each layer keeps for its backward pass (all layers without
    checkpointing; each layer's input plus one recomputed layer with it), the attention buffers, the backward
    pass's transient gradients of one layer, the final norm and one logprob chunk."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    h, i, b, t = shape.hidden, shape.intermediate, dtype_bytes, tokens
    lora = set(targets)
    kv_seen = shape.kv_out if attention == "flash_attention_2" else shape.q_out  # masked paths repeat KV heads
    per_token = 4 * h + 4 * h                                       # two RMS norms' fp32 inputs
    per_token += 4 * h * len(lora & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"})  # fp32 LoRA inputs
    per_token += 4 * shape.q_out * ("o_proj" in lora) + 4 * i * ("down_proj" in lora)
    per_token += b * (shape.q_out + 2 * kv_seen)                    # q, k, v as attention keeps them
    per_square = 0                                                  # bytes per layer per token^2
    if attention == "eager":
        per_square = shape.heads * (4 + b)                          # softmax's fp32 output and its cast
    else:
        per_token += b * shape.q_out + 4 * shape.heads              # output and log-sum-exp
        per_square = b if attention == "sdpa" else 0                # SDPA's additive copy of the 4-D mask
    per_token += 3 * b * i                                          # gate output, its SiLU, up output
    layer = t * per_token + t * t * per_square
    transient = t * 2 * b * i                                       # two MLP-wide gradients in flight
    shared = t * t * (attention != "flash_attention_2")             # the boolean mask, on the device
    shared += 2 * t * shape.head_dim * b                            # rotary cos and sin
    shared += t * h * (4 + b)                                       # final norm's fp32 input, the kept hidden rows
    shared += min(logprob_chunk, t) * shape.vocab * (b + 12)        # a chunk's logits, fp32 copy, log-softmax, grad
    if checkpointing:
        return shape.layers * t * h * b + layer + transient + shared
    return shape.layers * layer + transient + shared


def resolve_dtype(dtype: str, cuda: bool) -> str:
    """`ModelConfig.dtype` as the torch dtype's name the trainer loads: `auto` is bfloat16 on a GPU, float32 on
    the CPU."""
    if dtype == "auto":
        return "bfloat16" if cuda else "float32"
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be 'auto', 'bfloat16' or 'float32', got {dtype!r}")
    return dtype


def vllm_dtype(model_config: ModelConfig) -> str | None:
    """The dtype vLLM's server is started with: `EngineConfig.vllm_args['dtype']`, else `ModelConfig.dtype` when
    it is set, else None (vLLM's own default: the model's bf16)."""
    given = model_config.engine.vllm_args.get("dtype")
    if given is not None:
        return str(given)
    return None if model_config.dtype == "auto" else model_config.dtype


def default_checkpointing(parameters: int, cuda: bool) -> bool:
    """`ModelConfig.gradient_checkpointing=None`: on for models of 1B parameters or more on a GPU (on the CPU the
    backend turns it on when a pass would not fit the memory available: `ruler_rl.trainer.backend._cpu_checkpointing`)."""
    return cuda and parameters >= 1_000_000_000


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def memory_in_use(free: int, total: int, reserved: int = 0, allocated: int = 0) -> int:
    """Bytes of a CUDA device held by other processes and by models this process already holds, from
    `torch.cuda.mem_get_info` (`free`, `total`) and this process's `torch.cuda.memory_reserved` /
    `memory_allocated`: total - free, less this process's CUDA context (`CUDA_CONTEXT_BYTES`; asking created it)
    and less its allocator's cache (reserved but unallocated blocks, which it reuses), never below 0. Bad input
    is a ValueError."""
    for name, value in (("free", free), ("total", total), ("reserved", reserved), ("allocated", allocated)):
        _int(name, value, 0)
    if free > total:
        raise ValueError(f"free ({free}) must not exceed total ({total})")
    if allocated > reserved:
        raise ValueError(f"allocated ({allocated}) must not exceed reserved ({reserved})")
    return max(0, total - free - CUDA_CONTEXT_BYTES - (reserved - allocated))


def weight_shrinking(model_config: ModelConfig, hf_config: Mapping[str, Any]) -> str | None:
    """What makes the weights smaller than bf16 parameters on vLLM's device (a quantised model, CPU offload),
    as a phrase naming the setting; None when nothing does. Bad input is a TypeError."""
    if not isinstance(model_config, ModelConfig):
        raise TypeError(f"model_config must be a ruler_rl.trainer.ModelConfig, got {type(model_config).__name__}")
    if not isinstance(hf_config, Mapping):
        raise TypeError(f"hf_config must be the model's config.json as a dict, got {type(hf_config).__name__}")
    for cfg in (hf_config, hf_config.get("text_config")):
        if isinstance(cfg, Mapping) and cfg.get("quantization_config"):
            method = cfg["quantization_config"]
            method = method.get("quant_method", "") if isinstance(method, Mapping) else method
            return f"config.json's quantization_config ({method or 'quantised weights'})"
    for key, value in model_config.engine.vllm_args.items():
        flag = vllm_flag_name(key)
        if flag in WEIGHT_SHRINKING_FLAGS and value not in (None, False, 0, ""):
            return f"EngineConfig.vllm_args[{key!r}]={value!r}"
    return None


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


@dataclass(frozen=True)
class MemoryPlan:
    """A memory plan (an estimate): each phase's named terms in bytes, whether it fits, what to change.

    `rollout` and `training` map a term's name to bytes; each phase fits when its sum is <= `device_bytes`.
    `vllm_needs_bytes` (vLLM's weights + overhead + one `max_model_len`-token sequence of KV cache) must fit in
    `vllm_share_bytes` when vLLM runs (0 and 0 otherwise). `host` names the weight copies kept in CPU memory
    (vLLM's while it sleeps at level 1, the trainer's with `offload_during_rollouts`); they must fit in
    `host_bytes` when that was given (0: the host was not checked). `suggestions` is empty when the plan fits."""
    device_bytes: int
    base: str
    parameters: int
    lora_parameters: int
    dtype: str
    engine: str
    placement: str
    gradient_checkpointing: bool
    attention: str
    tokens_per_pass: int
    max_tokens_per_micro_batch: int
    max_seq_length: int
    margin: float
    rollout: dict[str, int]
    training: dict[str, int]
    activations_bytes: int
    activations_checkpointed_bytes: int
    activations_full_bytes: int
    vllm_share_bytes: int
    vllm_needs_bytes: int
    vllm_kv_cache_bytes: int
    vllm_kv_tokens: int
    problems: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    host: dict[str, int] = field(default_factory=dict)
    host_bytes: int = 0

    @property
    def rollout_bytes(self) -> int:
        return sum(self.rollout.values())

    @property
    def training_bytes(self) -> int:
        return sum(self.training.values())

    @property
    def fits(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line: both phases against the device."""
        vllm = ""
        if self.vllm_share_bytes:
            vllm = (f"; vLLM {_gib(self.vllm_share_bytes)} of which KV cache ~{_gib(self.vllm_kv_cache_bytes)} "
                    f"(~{self.vllm_kv_tokens:,} tokens)")
        return (f"memory plan for {self.base} (an estimate, {self.margin:.0%} margin on the trainer's terms): "
                f"rollout {_gib(self.rollout_bytes)}, training {_gib(self.training_bytes)} of "
                f"{_gib(self.device_bytes)}; {_count(self.parameters)} parameters in {self.dtype}, passes of "
                f"{self.tokens_per_pass} tokens, gradient checkpointing {'on' if self.gradient_checkpointing else 'off'}"
                f"{vllm}" + (f"; CPU memory {_gib(sum(self.host.values()))} of {_gib(self.host_bytes)} available"
                             if self.host and self.host_bytes else ""))

    def message(self) -> str:
        """Everything: the summary, each phase's terms, what does not fit and what to change."""
        lines = [self.summary() + (": fits" if self.fits else ": does NOT fit")]
        for phase, terms in (("rollout", self.rollout), ("training", self.training), ("CPU memory", self.host)):
            if not terms:
                continue
            parts = ", ".join(f"{name} {_gib(n)}" for name, n in terms.items() if n)
            lines.append(f"  {phase} {_gib(sum(terms.values()))} = {parts}")
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  change: {s}" for s in self.suggestions]
        if not self.fits:
            lines.append("  (ModelConfig.memory_check=False skips this check)")
        return "\n".join(lines)


def plan_memory(model_config: ModelConfig, hf_config: Mapping[str, Any], *, device_bytes: int,
                train: TrainConfig | None = None, cuda: bool = True, engine: str | None = None,
                attention: str | None = None, in_use_bytes: int = 0, margin: float | None = None,
                base: str = "the model", inference_device_bytes: int | None = None,
                host_bytes: int | None = None) -> MemoryPlan:
    """The `MemoryPlan` of training `model_config` on the model of `hf_config` (its config.json as a dict) on a
    device of `device_bytes` bytes. Pure: reads nothing, needs no GPU.

    `train`: the `TrainConfig` the steps will use (its `max_tokens_per_micro_batch` and `logprob_chunk_size`);
    default: `TrainConfig()` with `model_config.memory_check.max_tokens_per_micro_batch` when that is set.
    `cuda`: plan as the backend loads on a GPU (bf16 weights; gradient checkpointing `None` means on from 1B
    parameters); False: the CPU's fp32 and no checkpointing by default. `engine`: `vllm` or `transformers`;
    default `model_config.engine.engine`, `auto` meaning vLLM when `cuda`. `attention`: `sdpa` (default, what
    transformers picks), `eager` or `flash_attention_2`; default the config's `attn_implementation` if given.
    `in_use_bytes`: memory other processes already hold on the device. `margin`: the fraction of the
    trainer's terms added for what is not modelled; default `model_config.memory_check.margin`. `base` names
    the model in messages. `inference_device_bytes`: with `placement='dedicated'` and vLLM, the size of each
    inference GPU (vLLM's share is `gpu_memory_utilization` of it); default `device_bytes`. `host_bytes`: the CPU
    memory free for the run's weight copies (at register, what the OS reports available); None: not checked.
    Bad input is a
    TypeError or ValueError naming it; a model whose weights are quantised or offloaded (`weight_shrinking`) is a
    ValueError naming the setting (the plan models bf16 weights only)."""
    device_bytes, inference_bytes, host_bytes, in_use_bytes, margin = _checked_sizes(
        model_config, train, cuda, base, device_bytes, inference_device_bytes, host_bytes, in_use_bytes, margin)
    run = _resolve(model_config, hf_config, train=train, cuda=cuda, engine=engine, attention=attention,
                   in_use_bytes=in_use_bytes, margin=margin)
    vllm = _vllm_side(run, device_bytes, inference_bytes)
    rollout, training = _rollout_terms(run, vllm), _training_terms(run, vllm, run.tokens, run.checkpointing)
    whole, device = device_bytes, _gib(device_bytes)
    if run.shared:  # the trainer's phases are checked against its share of the GPU, vLLM's against its own
        share = run.ecfg.trainer_memory_share
        device_bytes = int(share * whole)
        device = (f"{_gib(device_bytes)} (the trainer's share: trainer_memory_share {share} of the {_gib(whole)} "
                  "GPU)")
    host, *host_verdict = _host_plan(run, vllm, host_bytes)
    verdicts = [_rollout_verdict(run, vllm, rollout, device_bytes, inference_bytes, device),
                _split_gpu_verdict(run, vllm, device_bytes, whole), host_verdict,
                _training_verdict(run, vllm, training, device_bytes, device)]
    problems = [problem for found, _ in verdicts for problem in found]
    suggestions = [suggestion for _, advice in verdicts for suggestion in advice]
    return MemoryPlan(
        device_bytes=device_bytes, base=base, parameters=run.params, lora_parameters=run.lora, dtype=run.dtype,
        engine=run.engine, placement=run.ecfg.placement, gradient_checkpointing=run.checkpointing,
        attention=run.attention, tokens_per_pass=run.tokens, max_tokens_per_micro_batch=run.mbt,
        max_seq_length=run.seq, margin=float(margin), rollout=rollout, training=training,
        activations_bytes=run.activations(run.tokens, run.checkpointing),
        activations_checkpointed_bytes=run.activations(run.tokens, True),
        activations_full_bytes=run.activations(run.tokens, False), vllm_share_bytes=vllm.share,
        vllm_needs_bytes=vllm.needs, vllm_kv_cache_bytes=vllm.kv,
        vllm_kv_tokens=vllm.kv // vllm.kv_per_token if vllm.kv else 0, problems=problems, suggestions=suggestions,
        host=host, host_bytes=host_bytes)


def _checked_sizes(model_config, train, cuda, base, device_bytes, inference_device_bytes, host_bytes, in_use_bytes,
                   margin) -> tuple[int, int, int, int, float]:
    """plan_memory's arguments checked (TypeError / ValueError naming the bad one): (device, inference device,
    host (0: not checked), in use) bytes and the margin (`memory_check.margin` when None)."""
    if not isinstance(model_config, ModelConfig):
        raise TypeError(f"model_config must be a ruler_rl.trainer.ModelConfig, got {type(model_config).__name__}")
    if train is not None and not isinstance(train, TrainConfig):
        raise TypeError(f"train must be a ruler_rl.trainer.TrainConfig or None, got {type(train).__name__}")
    if not isinstance(cuda, bool):
        raise TypeError(f"cuda must be a bool, got {type(cuda).__name__}")
    if not isinstance(base, str) or not base.strip():
        raise TypeError(f"base must be a non-empty str naming the model, got {base!r}")
    device_bytes = _int("device_bytes", device_bytes, 1)
    inference_bytes = device_bytes if inference_device_bytes is None else _int(
        "inference_device_bytes", inference_device_bytes, 1)
    host_bytes = 0 if host_bytes is None else _int("host_bytes", host_bytes, 1)
    in_use_bytes = _int("in_use_bytes", in_use_bytes, 0)
    if in_use_bytes >= device_bytes:
        raise ValueError(f"in_use_bytes ({in_use_bytes}) must be below device_bytes ({device_bytes})")
    margin = model_config.memory_check.margin if margin is None else margin
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin <= 1:
        raise ValueError(f"margin must be a fraction 0..1, got {margin!r}")
    return device_bytes, inference_bytes, host_bytes, in_use_bytes, margin


@dataclass(frozen=True)
class _Run:
    """The model's sizes and the run's settings as the plan uses them, and the trainer's terms they give."""
    shape: Shape
    ecfg: EngineConfig
    engine: str  # vllm or transformers
    attention: str
    dtype: str
    dtype_bytes: int
    vllm_dtype_bytes: int  # of vLLM's weights and KV cache
    params: int
    lora: int
    targets: list[str]
    checkpointing: bool
    mbt: int  # max_tokens_per_micro_batch
    seq: int  # max_seq_length
    tokens: int  # the most tokens of one pass
    logprob_chunk: int
    cuda: bool
    margin: float
    in_use_bytes: int
    colocated: bool  # vLLM on the trainer's device, asleep or awake while it trains
    shared: bool  # one GPU split in two: both processes on it at once
    offloaded: bool  # offload_during_rollouts with a colocated vLLM

    @property
    def weights(self) -> int:
        """The trainer's base weights in bytes."""
        return self.params * self.dtype_bytes

    def activations(self, tokens: int, checkpointing: bool) -> int:
        return activation_bytes(self.shape, tokens, checkpointing=checkpointing, targets=self.targets,
                                attention=self.attention, dtype_bytes=self.dtype_bytes,
                                logprob_chunk=self.logprob_chunk)

    def trainer_terms(self, training: bool, tokens: int, checkpointing: bool,
                      offload: bool | None = None) -> dict[str, int]:
        """The trainer's own terms in one phase (`offload`: the base weights in CPU memory outside training;
        default as planned), the margin on them last."""
        offload = self.offloaded if offload is None else offload
        terms = {"CUDA context": CUDA_CONTEXT_BYTES} if self.cuda else {}
        if training or not offload:  # offloaded: in CPU memory while vLLM serves
            terms[f"base weights ({self.dtype})"] = self.weights
        terms["LoRA parameters + AdamW state (fp32)"] = self.lora * 12
        if training:
            terms["LoRA gradients (fp32)"] = self.lora * 4
            terms[f"activations ({tokens} tokens, checkpointing {'on' if checkpointing else 'off'})"] = \
                self.activations(tokens, checkpointing)
        terms[f"margin ({self.margin:.0%} of the trainer's terms)"] = int(self.margin * sum(terms.values()))
        return terms


def _resolve(model_config: ModelConfig, hf_config: Mapping[str, Any], *, train: TrainConfig | None, cuda: bool,
             engine: str | None, attention: str | None, in_use_bytes: int, margin: float) -> _Run:
    """The `_Run` of plan_memory's arguments: the model's shape and counts, the engine, attention, dtype,
    checkpointing and tokens per pass as the backend would pick them; a config it cannot plan is a ValueError."""
    shape = model_shape(hf_config)
    shrunk = weight_shrinking(model_config, hf_config)
    if shrunk is not None:
        raise ValueError(f"{shrunk} makes the weights smaller than the bf16 parameters the memory plan assumes "
                         "(quantised or offloaded): no plan is made for such a model")
    if attention is None:
        attention = hf_config.get("attn_implementation") or hf_config.get("_attn_implementation") or "sdpa"
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    ecfg = model_config.engine
    engine = engine or ecfg.engine
    if engine == "auto":
        engine = "vllm" if cuda else "transformers"
    if engine not in ("vllm", "transformers"):
        raise ValueError(f"engine must be 'vllm' or 'transformers', got {engine!r}")
    if train is None:
        check = model_config.memory_check
        train = TrainConfig(**({"max_tokens_per_micro_batch": check.max_tokens_per_micro_batch}
                               if check.max_tokens_per_micro_batch else {}))
    dtype = resolve_dtype(model_config.dtype, cuda)
    params = shape.parameters()
    checkpointing = model_config.gradient_checkpointing
    if checkpointing is None:  # as the backend decides
        checkpointing = default_checkpointing(params, cuda)
    targets = list(model_config.lora.target_modules)
    mbt, seq = train.max_tokens_per_micro_batch, ecfg.max_seq_length
    colocated = engine == "vllm" and ecfg.placement == "colocated"
    return _Run(shape=shape, ecfg=ecfg, engine=engine, attention=attention, dtype=dtype,
                dtype_bytes=_DTYPE_BYTES[dtype], params=params,
                vllm_dtype_bytes={**_DTYPE_BYTES, "float": 4, "half": 2}.get(vllm_dtype(model_config) or "bfloat16", 2),
                lora=lora_parameters(shape, model_config.lora.rank, targets), targets=targets,
                checkpointing=checkpointing, mbt=mbt, seq=seq,
                tokens=seq if attention == "flash_attention_2" else max(mbt, seq),  # no mask: one sequence per pass
                logprob_chunk=train.logprob_chunk_size, cuda=cuda, margin=margin, in_use_bytes=in_use_bytes,
                colocated=colocated, shared=engine == "vllm" and ecfg.shares_gpu,
                offloaded=model_config.offload_during_rollouts and colocated)


@dataclass(frozen=True)
class _VLLMSide:
    """vLLM's share of its device, what it needs in it, and what it keeps while the trainer trains (all 0 without
    vLLM)."""
    kv_per_token: int  # KV cache bytes per token, in vLLM's dtype
    model_len: int  # max_model_len
    tp: int = 1  # tensor-parallel inference GPUs
    weights: int = 0  # per GPU
    overhead: int = 0
    share: int = 0
    needs: int = 0  # weights + overhead + the KV cache of one max_model_len sequence
    kv: int = 0  # the KV cache its share leaves
    asleep: int = 0  # what it keeps at sleep level 1
    in_training: int = 0  # what it keeps on the trainer's device while a step trains

    @property
    def one_sequence_kv(self) -> float:
        return self.model_len * self.kv_per_token / self.tp


def _vllm_side(run: _Run, device_bytes: int, inference_bytes: int) -> _VLLMSide:
    """vLLM's side of the plan: its weights and KV cache in its own dtype, its share (of the trainer's device when
    colocated or split, else of an inference GPU), and its memory while asleep."""
    ecfg = run.ecfg
    vllm_b = run.vllm_dtype_bytes
    kv_per_token = run.shape.kv_bytes_per_token(vllm_b)
    model_len = ecfg.max_model_len or run.seq
    if run.engine != "vllm":
        return _VLLMSide(kv_per_token, model_len)
    tp = len(ecfg.inference_gpus) if (ecfg.placement == "dedicated" and ecfg.inference_parallel == "tensor"
                                      and ecfg.inference_gpus) else 1
    weights = math.ceil(run.params * vllm_b / tp)
    overhead = VLLM_OVERHEAD_BYTES + int(VLLM_OVERHEAD_SHARE * weights)
    share = int(ecfg.gpu_memory_utilization * (device_bytes if run.colocated or run.shared else inference_bytes))
    asleep = VLLM_CONTEXT_BYTES + int(VLLM_SLEEP_SHARE * share)
    in_training = (asleep if ecfg.enable_sleep_mode else share) if run.colocated else 0
    return _VLLMSide(kv_per_token, model_len, tp=tp, weights=weights, overhead=overhead, share=share,
                     needs=weights + overhead + math.ceil(model_len * kv_per_token / tp),
                     kv=max(0, share - weights - overhead), asleep=asleep, in_training=in_training)


def _rollout_terms(run: _Run, vllm: _VLLMSide) -> dict[str, int]:
    """The rollout phase: the trainer's resident state, a colocated vLLM's whole share, other processes."""
    terms = run.trainer_terms(False, run.tokens, run.checkpointing)
    if run.colocated:
        terms[f"vLLM's share (gpu_memory_utilization {run.ecfg.gpu_memory_utilization})"] = vllm.share
    terms["in use by other processes"] = 0 if run.shared else run.in_use_bytes  # shared: beside both shares
    return terms


def _training_terms(run: _Run, vllm: _VLLMSide, tokens: int, checkpointing: bool,
                    vllm_bytes: int | None = None) -> dict[str, int]:
    """The training phase of a `tokens`-token pass: the trainer's terms, what a colocated vLLM keeps
    (`vllm_bytes`, default as planned), other processes."""
    terms = run.trainer_terms(True, tokens, checkpointing)
    if run.colocated:
        kept = vllm.in_training if vllm_bytes is None else vllm_bytes
        terms["vLLM asleep (level 1)" if run.ecfg.enable_sleep_mode else "vLLM awake (no sleep mode)"] = kept
    terms["in use by other processes"] = 0 if run.shared else run.in_use_bytes
    return terms


def _rollout_verdict(run: _Run, vllm: _VLLMSide, rollout: dict[str, int], device_bytes: int, inference_bytes: int,
                     device: str) -> tuple[list[str], list[str]]:
    """(problems, suggestions) of the rollout phase: vLLM's share must hold what it needs, the phase must fit
    the trainer's device."""
    problems: list[str] = []
    trainer_resident = sum(v for k, v in rollout.items() if not k.startswith("vLLM"))
    vllm_short = run.engine == "vllm" and vllm.needs > vllm.share
    if vllm_short:
        where = "its device" if run.ecfg.placement == "dedicated" else "the device"
        problems.append(f"gpu_memory_utilization {run.ecfg.gpu_memory_utilization} gives vLLM {_gib(vllm.share)} of "
                        f"{where}, less than the {_gib(vllm.needs)} it needs: its weights {_gib(vllm.weights)} + "
                        f"overhead {_gib(vllm.overhead)} + the KV cache of one {vllm.model_len}-token sequence "
                        f"{_gib(vllm.one_sequence_kv)}")
    rollout_bytes = sum(rollout.values())
    too_big = rollout_bytes > device_bytes
    if too_big and run.colocated:
        problems.append(f"rollout needs {_gib(rollout_bytes)} of {device}: the trainer's {_gib(trainer_resident)}"
                        + ("" if run.offloaded else f" (weights {_gib(run.weights)})")
                        + f" stays beside vLLM's share of {_gib(vllm.share)}")
    elif too_big:
        problems.append(f"rollout needs {_gib(rollout_bytes)} of {device}: the trainer's weights alone are "
                        f"{_gib(run.weights)}")
    suggestions: list[str] = []
    if run.colocated and (vllm_short or too_big):
        suggestions += _utilization_advice(run, vllm, trainer_resident, device_bytes, device)
    elif vllm_short:
        suggestions.append(_inference_gpu_advice(run, vllm, inference_bytes))
    if too_big and run.shared:
        suggestions.append(f"the trainer's resident state ({_gib(trainer_resident)}) exceeds its share: raise "
                           "trainer_memory_share (lowering gpu_memory_utilization to make room), or use "
                           "placement='colocated' (vLLM sleeps while the trainer trains)")
    elif too_big and not run.colocated:
        suggestions.append(f"the trainer's resident state ({_gib(trainer_resident)}) exceeds {device}: use a "
                           "larger device or a smaller model")
    return problems, suggestions


def _utilization_advice(run: _Run, vllm: _VLLMSide, trainer_resident: int, device_bytes: int,
                        device: str) -> list[str]:
    """A colocated run whose rollout phase does not fit: the window of gpu_memory_utilization that does, with
    and without offloading the trainer's weights, or that none does."""
    util = run.ecfg.gpu_memory_utilization
    suggestions = []
    low = math.ceil(vllm.needs / device_bytes * 100) / 100
    high = math.floor((device_bytes - trainer_resident) / device_bytes * 100) / 100
    if low <= high:
        kv_left = int(high * device_bytes) - vllm.needs + math.ceil(vllm.model_len * vllm.kv_per_token)
        suggestions.append(f"set gpu_memory_utilization between {low:.2f} and {high:.2f} (now {util}): vLLM needs "
                           f">= {_gib(vllm.needs)}, the trainer keeps {_gib(trainer_resident)} beside it; at "
                           f"{high:.2f} vLLM's KV cache is ~{_gib(kv_left)} (~{kv_left // vllm.kv_per_token:,} "
                           "tokens of concurrent rollouts)")
    if not run.offloaded:
        resident = sum(run.trainer_terms(False, run.tokens, run.checkpointing, offload=True).values())
        free = math.floor((device_bytes - resident - run.in_use_bytes) / device_bytes * 100) / 100
        if low <= free:
            suggestions.append(f"set ModelConfig.offload_during_rollouts=True (the trainer's {_gib(run.weights)} "
                               "of weights in CPU memory while vLLM serves, back on the GPU for each step): then "
                               f"gpu_memory_utilization between {low:.2f} and {free:.2f}")
    if low > high:
        suggestions.append(f"no gpu_memory_utilization fits both copies of the weights: vLLM needs "
                           f">= {_gib(vllm.needs)} and the trainer {_gib(trainer_resident)} of {device}; use "
                           "placement='dedicated' (vLLM on inference_gpus, the trainer on trainer_gpus), a "
                           "larger device or a smaller model")
    return suggestions


def _inference_gpu_advice(run: _Run, vllm: _VLLMSide, inference_bytes: int) -> str:
    """A vLLM off the trainer's device whose share does not hold what it needs: a larger share, or what else."""
    low = math.ceil(vllm.needs / inference_bytes * 100) / 100
    if low <= 1:
        return f"set gpu_memory_utilization >= {low:.2f} (now {run.ecfg.gpu_memory_utilization})"
    if vllm.weights + vllm.overhead > inference_bytes:
        return (f"vLLM's weights ({_gib(vllm.weights)} + overhead {_gib(vllm.overhead)}) do not fit one inference "
                f"GPU of {_gib(inference_bytes)}: more inference_gpus with inference_parallel='tensor', larger "
                "inference GPUs or a smaller model")
    return (f"vLLM's weights fit one inference GPU of {_gib(inference_bytes)}, the KV cache of one "
            f"{vllm.model_len}-token sequence beside them does not: a smaller EngineConfig.max_model_len, or more "
            "inference_gpus with inference_parallel='tensor'")


def _split_gpu_verdict(run: _Run, vllm: _VLLMSide, trainer_bytes: int, whole: int) -> tuple[list[str], list[str]]:
    """(problems, suggestions) of one GPU split in two (none otherwise): vLLM's share, the trainer's and what other
    processes use must fit the GPU."""
    if not run.shared or vllm.share + trainer_bytes + run.in_use_bytes <= whole:
        return [], []
    problem = (f"one GPU split in two: vLLM's share {_gib(vllm.share)} (gpu_memory_utilization "
               f"{run.ecfg.gpu_memory_utilization}) + the trainer's {_gib(trainer_bytes)} (trainer_memory_share "
               f"{run.ecfg.trainer_memory_share}) + {_gib(run.in_use_bytes)} other processes already use exceed the "
               f"{_gib(whole)} GPU: a training step beside vLLM could run out of memory, or vLLM refuse to start "
               "(it needs its share free)")
    return [problem], ["lower gpu_memory_utilization or trainer_memory_share, or free the GPU"]


def _host_plan(run: _Run, vllm: _VLLMSide, host_bytes: int) -> tuple[dict[str, int], list[str], list[str]]:
    """(the weight copies kept in CPU memory, problems, suggestions): they must fit `host_bytes` (0: not
    checked)."""
    host: dict[str, int] = {}
    if run.colocated and run.ecfg.enable_sleep_mode:
        host["vLLM's weights while asleep (level 1)"] = vllm.weights
    if run.offloaded:
        host[f"the trainer's base weights ({run.dtype}, offload_during_rollouts)"] = run.weights
    if not host_bytes or sum(host.values()) <= host_bytes:
        return host, [], []
    parts = " + ".join(f"{name} {_gib(n)}" for name, n in host.items())
    problem = (f"CPU memory: the weight copies kept on the host need {_gib(sum(host.values()))} ({parts}), more "
               f"than the {_gib(host_bytes)} available")
    if run.offloaded:
        suggestion = ("set ModelConfig.offload_during_rollouts=False (the host then keeps vLLM's copy only, "
                      f"{_gib(vllm.weights)}; both copies stay on the GPU while vLLM serves), or free host memory")
    else:
        suggestion = ("set EngineConfig.enable_sleep_mode=False (vLLM keeps its weights on the GPU while "
                      "training), use placement='dedicated', or free host memory")
    return host, [problem], [suggestion]


def _training_verdict(run: _Run, vllm: _VLLMSide, training: dict[str, int], device_bytes: int,
                      device: str) -> tuple[list[str], list[str]]:
    """(problems, suggestions) of the training phase: when it does not fit, what checkpointing, sleep mode or
    fewer tokens per pass would give."""
    training_bytes = sum(training.values())
    if training_bytes <= device_bytes:
        return [], []
    tokens, checkpointing = run.tokens, run.checkpointing
    act = run.activations(tokens, checkpointing)
    problems = [(f"training needs {_gib(training_bytes)} of {device} (activations of a {tokens}-token pass "
                 f"{_gib(act)})")]
    if run.mbt < tokens:
        problems.append(f"max_seq_length {run.seq} > max_tokens_per_micro_batch {run.mbt}: a sequence cannot be "
                        f"split, so a pass holds up to {run.seq} tokens")
    suggestions = []
    if not checkpointing:
        on = run.activations(tokens, True)
        then = sum(_training_terms(run, vllm, tokens, True).values())
        suggestions.append(f"turn on gradient checkpointing (ModelConfig.gradient_checkpointing=True): "
                           f"activations {_gib(act)} -> {_gib(on)}, training {_gib(then)} of {device}"
                           + ("" if then <= device_bytes else " (not enough alone)"))
    if run.colocated and not run.ecfg.enable_sleep_mode:
        then = sum(_training_terms(run, vllm, tokens, checkpointing, vllm.asleep).values())
        suggestions.append(f"turn on EngineConfig.enable_sleep_mode: vLLM's {_gib(vllm.share)} is freed during "
                           f"training (training {_gib(then)} of {device})")
    suggestions.append(_micro_batch_advice(run, vllm, device_bytes, device, act))
    return problems, suggestions


def _micro_batch_advice(run: _Run, vllm: _VLLMSide, device_bytes: int, device: str, act: int) -> str:
    """The most tokens per pass that fit (as planned, else with checkpointing on) and the settings that give it,
    or that even a 16-token pass does not fit."""
    def fits(tokens: int, checkpointing: bool) -> bool:
        return sum(_training_terms(run, vllm, tokens, checkpointing).values()) <= device_bytes

    for ckpt in dict.fromkeys([run.checkpointing, True]):
        lo, hi = 16, run.tokens - 1  # the most tokens per pass that fit
        if not fits(lo, ckpt):
            continue
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid, ckpt) else (lo, mid - 1)
        best = lo - lo % 256 if lo >= 512 else lo
        change = (f"set TrainConfig.max_tokens_per_micro_batch <= {best} (the steps' micro-batches) and "
                  f"ModelConfig.memory_check.max_tokens_per_micro_batch <= {best} (what this plan assumes)")
        if run.seq > best:
            change += (f" and EngineConfig.max_seq_length <= {best} (now {run.seq}; a sequence is never split "
                       "across passes, longer ones are truncated)")
        with_ckpt = " with gradient checkpointing on" if ckpt and not run.checkpointing else ""
        return f"{change}{with_ckpt}: activations {_gib(act)} -> {_gib(run.activations(best, ckpt))}"
    base_terms = sum(_training_terms(run, vllm, 16, True).values())
    return (f"even a 16-token pass needs {_gib(base_terms)} of {device}: use a larger device, a smaller model"
            + (", placement='dedicated'" if run.colocated else ""))
