"""What a run is configured with: the LoRA (`LoRAConfig`), the inference engine (`EngineConfig`), both per model
(`ModelConfig`), and each training step (`TrainConfig`).

Every field is documented where it is declared (`Field(description=...)`, also readable as
`TrainConfig.model_fields["epsilon_high"].description`): what it does, its default, units, valid range, and how
it interacts with other fields. Unknown fields are refused, and so is assignment of an invalid value.

Options that only act together with another setting are checked:

- `TrainConfig`: an option set to a value other than its default that the chosen setting ignores is an error
  (`epsilon_high` only acts under `loss="dapo"`, `completion_budget` only under `loss="dr_grpo"`,
  `sampler_cap` only with `sampler_correction="tis"`, `min_shared_prefix` only with `share_prefix`), since it
  means the step would not compute what its author wrote. A default value is never an error, so a dumped
  config reloads.
- `EngineConfig`: a vLLM-only option set to a non-default value with `engine="transformers"` is a warning
  (`UserWarning`), since one configuration often serves both engines (a script that switches engine by
  flag); flags in `vllm_args` that the engine sets itself are an error.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import pydantic

LossKind = Literal["grpo", "dr_grpo", "dapo"]
LLAMA_LIKE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# vLLM server flags `ruler_rl.trainer.vllm_server.VLLMServer` sets itself, and where to set them instead
_ENGINE_OWNED_FLAGS = {
    "model": "the model's base_model", "served_model_name": "the model's name", "host": "LocalBackend(host=...)",
    "port": "a free port, picked at start", "enable_lora": "always on", "max_lora_rank": "LoRAConfig.rank",
    "max_loras": "set by the engine", "max_cpu_loras": "keep_adapters", "middleware": "set by the engine",
    "gpu_memory_utilization": "gpu_memory_utilization", "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs", "enable_sleep_mode": "enable_sleep_mode", "enforce_eager": "enforce_eager",
    "max_num_batched_tokens": "max_num_batched_tokens", "disable_log_stats": "log_stats",
    "generation_config": "set by the engine (vLLM's sampling defaults)", "enable_auto_tool_choice": "always on",
    "tool_call_parser": "tool_call_parser", "reasoning_parser": "reasoning_parser",
    "chat_template": "chat_template", "disable_uvicorn_access_log": "set by the engine",
    "tensor_parallel_size": "inference_gpus with inference_parallel='tensor'",
    "data_parallel_size": "inference_gpus with inference_parallel='data'",
    "structured_outputs_config": "compact_json=False, then vllm_args",
}
# owned flags a field hands back to the user when it is off: {flag: field}
_OWNED_UNLESS = {"structured_outputs_config": "compact_json"}
_VLLM_ONLY = ("gpu_memory_utilization", "max_model_len", "enforce_eager", "enable_sleep_mode", "max_num_seqs",
              "max_num_batched_tokens", "log_stats", "compact_json", "keep_adapters", "startup_timeout_s", "server_timeout_s",
              "vllm_args", "inference_parallel")
Placement = Literal["colocated", "dedicated"]


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)

    def _changed(self, names) -> list[str]:
        """Those of `names` given explicitly with a value other than their default (a dumped and reloaded config
        gives every field explicitly, at its default where it was not set)."""
        return [n for n in names if n in self.model_fields_set
                and getattr(self, n) != type(self).model_fields[n].get_default(call_default_factory=True)]

    def __setattr__(self, name: str, value: Any) -> None:
        """Validated assignment that leaves the object as it was when a cross-field check refuses it (pydantic
        would keep the refused value)."""
        before, fields_set = dict(self.__dict__), set(self.__pydantic_fields_set__)
        try:
            super().__setattr__(name, value)
        except pydantic.ValidationError:
            self.__dict__.clear()
            self.__dict__.update(before)
            self.__pydantic_fields_set__ = fields_set
            raise


class LoRAConfig(_Strict):
    """The LoRA adapter trained on the base model (peft `LoraConfig`, task `CAUSAL_LM`)."""

    rank: int = pydantic.Field(8, ge=1, le=512, description=(
        "LoRA rank r: the inner dimension of each adapter's A (r x in) and B (out x r) matrices. Default 8; "
        "1-512. Trainable parameters grow linearly with it. The vLLM engine serves it with the smallest "
        "`--max-lora-rank` vLLM accepts that holds it (1, 8, 16, 32, 64, 128, 256, 320, 512)."))
    alpha: float = pydantic.Field(16.0, gt=0, description=(
        "LoRA alpha: the adapter's output is scaled by alpha / rank. Default 16.0 (a scale of 2 at rank 8); "
        "> 0. Changing rank without alpha changes the effective learning rate of the adapter."))
    dropout: float = pydantic.Field(0.0, ge=0, lt=1, description=(
        "Dropout on the adapter's input during training, a probability. Default 0.0; 0 <= dropout < 1. "
        "Anything above 0 is active in the training forward pass but not when sampling, so importance "
        "ratios no longer start at exactly 1 (the backend warns at register)."))
    target_modules: list[str] = pydantic.Field(default_factory=lambda: list(LLAMA_LIKE_TARGETS), min_length=1,
                                               description=(
        "Names of the modules that get an adapter (matched by peft against the model's module names). Default: "
        "the attention and MLP projections of Llama-like models (q/k/v/o_proj, gate/up/down_proj); at least "
        "one. Names the model lacks fail at register. The vLLM engine serves LoRA on linear layers only: "
        "`embed_tokens`, `lm_head`, `wte` or `word_embeddings` are refused with it."))

    def wrap(self, model, base: str):
        """`model` (a transformers causal LM) with a fresh adapter of this config (peft, B = 0: it answers as the
        base until trained); target modules the architecture lacks are a ValueError naming `base`."""
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=self.target_modules, task_type="CAUSAL_LM")
        try:
            return get_peft_model(model, lora)
        except ValueError as exc:
            raise ValueError(f"LoRA target_modules {self.target_modules} do not fit {base}: {exc}") from None


def vllm_flag_name(key: str) -> str:
    """A `vllm_args` key as vLLM's argument name: leading dashes dropped, dashes as underscores
    (`--max-num-seqs` and `max_num_seqs` are one flag)."""
    return key.lstrip("-").replace("-", "_")


class EngineConfig(_Strict):
    """Which engine serves rollouts and how (`ruler_rl.trainer.engine.Engine`).

    `transformers` generates in the training process with the weights being trained, behind the backend's
    small OpenAI-compatible server (CPU or a GPU without vLLM; no adapter loading, no sleep). `vllm` runs
    vLLM's own OpenAI server as a child process (GPU), loading each step's adapter and sleeping around
    training steps. Fields from `gpu_memory_utilization` on are vLLM's alone: with `engine="transformers"`
    setting one to a non-default value only warns (they have no effect there).
    """

    engine: Literal["auto", "transformers", "vllm"] = pydantic.Field("auto", description=(
        "The inference engine. Default `auto`: `vllm` when vLLM is installed and a CUDA GPU is present, else "
        "`transformers`. `vllm` needs `pip install 'ruler-rl[gpu]'` and a GPU."))
    max_seq_length: int = pydantic.Field(2048, ge=16, description=(
        "The most tokens of one sequence (prompt + completion), in tokens. Default 2048; >= 16. The CPU server "
        "refuses longer prompts and caps `max_tokens` at the room left; training truncates longer sequences to "
        "it (counted as `truncated` in the run log); with vLLM it is also `--max-model-len` unless "
        "`max_model_len` is set."))
    tool_call_parser: str | None = pydantic.Field(None, description=(
        "vLLM's tool-call parser name (`hermes`, `llama3_json`, `mistral`, ...). Default None: picked by model "
        "family (`ruler_rl.trainer.vllm_server.default_parsers`: Qwen3 and Qwen2.5/ChatML `hermes`, Llama-3.x "
        "`llama3_json`, Mistral `mistral`, anything else `hermes`). The CPU server parses `hermes` and "
        "`llama3_json` only and refuses others at register."))
    reasoning_parser: str | None = pydantic.Field(None, description=(
        "vLLM's reasoning parser name: text before `</think>` becomes `message.reasoning`. Default None: "
        "`qwen3` for Qwen3 models, none otherwise. The CPU server knows `qwen3` only."))
    chat_template: str | None = pydantic.Field(None, description=(
        "A jinja chat template replacing the tokenizer's, for both engines and for re-rendered off-policy "
        "text. Default None: the tokenizer's own (a ChatML template that cannot render tools is replaced by "
        "`ruler_rl.trainer.chat.HERMES_CHATML_TEMPLATE` for requests with tools)."))
    gpu_memory_utilization: float = pydantic.Field(0.5, gt=0, le=1, description=(
        "vLLM only: the fraction of the GPU's memory vLLM may take for weights and KV cache. Default 0.5; "
        "0 < x <= 1. The trainer shares the GPU, so leave room for the model, its gradients and activations "
        "(`enable_sleep_mode` frees vLLM's share during each step)."))
    max_model_len: int | None = pydantic.Field(None, ge=16, description=(
        "vLLM only: `--max-model-len`, the context length vLLM serves, in tokens. Default None: "
        "`max_seq_length`; >= 16. Above `max_seq_length`, vLLM serves conversations that training truncates."))
    enforce_eager: bool = pydantic.Field(False, description=(
        "vLLM only: `--enforce-eager`, no CUDA graphs: faster start and less memory, slower generation. "
        "Default False."))
    enable_sleep_mode: bool = pydantic.Field(True, description=(
        "vLLM only: run vLLM with `--enable-sleep-mode` and put it to sleep (weights offloaded, KV cache "
        "freed) for each training step; requests that arrive meanwhile wait. Default True. Off: vLLM keeps "
        "its memory during training (both must fit) and keeps answering with the previous step's adapter."))
    max_num_seqs: int = pydantic.Field(256, ge=1, description=(
        "vLLM only: `--max-num-seqs`, the most sequences vLLM generates concurrently. Default 256; >= 1."))
    max_num_batched_tokens: int | None = pydantic.Field(None, ge=16, description=(
        "vLLM only: `--max-num-batched-tokens`, the most tokens (prefill chunks and decodes) one engine step "
        "schedules. Default None: the value vLLM gives its offline engine (`vllm.LLM`) on the serving GPU, "
        "16384 on GPUs of 70 GiB or more other than the A100 and 8192 on others "
        "(`ruler_rl.trainer.vllm_server.rollout_batched_tokens`), raised to `max_num_seqs` where that is larger (vLLM "
        "refuses less) and, with chunked prefill off (`vllm_args={'no_enable_chunked_prefill': True}`), to the "
        "served context length (as vLLM raises its own default); "
        "vLLM's own server would take a half (large GPUs) or a quarter (others) of it, a latency setting for "
        "chat traffic, while rollouts are batch work (multi-turn agents prefill thousands of new tokens per "
        "turn). Set: >= 16 and >= `max_num_seqs` (vLLM refuses less), and with chunked prefill off >= the "
        "served context length (`max_model_len`, else `max_seq_length`)."))
    log_stats: bool = pydantic.Field(False, description=(
        "vLLM only: keep vLLM's per-step statistics (its periodic throughput log lines and `/metrics`). Default "
        "False: `--disable-log-stats`, as vLLM's offline engine runs, so the engine does not collect them every "
        "step."))
    compact_json: bool = pydantic.Field(True, description=(
        "vLLM only: JSON that vLLM samples under a JSON schema (a served judge's scores, any `response_format`) is "
        "written on one line with json.dumps' separators, no free whitespace: `--structured-outputs-config "
        "'{\"backend\": \"xgrammar\", \"disable_any_whitespace\": true}'` "
        "(`ruler_rl.judges.vllm_settings.COMPACT_JSON`). Default True: vLLM 0.24's default grammar allows any "
        "whitespace between JSON tokens, and a 1.5B self-judge wrote newlines after `\"scores\": [` until its "
        "token limit (2026-12-07). Tool calls under strict tool calling (vLLM's default) use structural tags, which "
        "this does not change. The backend is named because vLLM refuses the setting under `auto`; a schema "
        "xgrammar refuses (`multipleOf`, `uniqueItems`, `patternProperties`, some string formats) is then an error "
        "rather than another backend's grammar. False: vLLM's own settings, and `vllm_args` may then set "
        "`structured_outputs_config` itself."))
    keep_adapters: int = pydantic.Field(2, ge=1, description=(
        "vLLM only: how many of the latest steps' adapters stay servable as `<name>@<step>`; older names are "
        "unloaded (requests naming them get 404). Default 2; >= 1. Also sets `--max-cpu-loras` "
        "(keep_adapters + 1, at least 2)."))
    startup_timeout_s: float = pydantic.Field(900, gt=0, description=(
        "vLLM only: how long vLLM's server may take to answer its health check at register, in seconds. "
        "Default 900; > 0. Weights download and CUDA-graph capture count."))
    server_timeout_s: float = pydantic.Field(600, gt=0, description=(
        "vLLM only: the timeout of each control call to vLLM (load/unload adapter, sleep, wake), in seconds. "
        "Default 600; > 0. Sleep waits for in-flight requests, so allow for the longest rollout turn."))
    vllm_args: dict[str, Any] = pydantic.Field(default_factory=dict, description=(
        "vLLM only: further server flags, `{name: value}` with `_` or `-` in names: `{\"swap_space\": 8}` "
        "becomes `--swap-space 8`, `True` a bare flag, `False`/None nothing, a dict or list JSON. Default none. "
        "Flags the engine sets itself (model, port, LoRA, parsers, the fields above, ...) are refused: use "
        "the field named in the error."))

    placement: Placement = pydantic.Field("colocated", description=(
        "Where inference runs relative to training. Default `colocated`: one device holds both; vLLM sleeps "
        "during each training step (`enable_sleep_mode`) and rollouts wait for it. `dedicated`: inference has "
        "devices of its own and keeps serving while the trainer trains (no sleep/wake; each step's adapter "
        "is loaded when it is written), so rollouts for the next step can be gathered during a step "
        "(`TrainConfig.max_off_policy_steps`, `ruler_rl.trainer.pipeline`). With vLLM, `dedicated` needs "
        "`inference_gpus` and `trainer_gpus`: disjoint, or one GPU split in two (`inference_gpus == trainer_gpus "
        "== [g]` with explicit `gpu_memory_utilization` and `trainer_memory_share`: both processes on it at once, "
        "no sleep). With `engine='transformers'` it runs the CPU "
        "engine's server in a child process of its own on the CPU (no GPU lists): the same protocol, for "
        "tests and small machines. See the README's Scale section."))
    inference_gpus: list[int] = pydantic.Field(default_factory=list, description=(
        "`placement='dedicated'` with vLLM only: the CUDA device indices (as this process numbers them) vLLM's "
        "server runs on; its child process gets them as `CUDA_VISIBLE_DEVICES`. Several: vLLM's own "
        "`--tensor-parallel-size` or `--data-parallel-size` of that count (`inference_parallel`). Default "
        "none. Distinct ints >= 0, disjoint from `trainer_gpus` (or equal to it: one GPU split in two, "
        "`trainer_memory_share`); indices beyond the visible GPUs fail at "
        "register."))
    trainer_gpus: list[int] = pydantic.Field(default_factory=list, description=(
        "`placement='dedicated'` with vLLM only: the CUDA device indices of the trainer; the LoRA model is "
        "trained on the first (`cuda:<first>`); more than one is accepted but only the first is used in this "
        "version (a warning; sharding the trainer with torch FSDP is the README's Scale plan). Default none. "
        "Distinct ints >= 0, disjoint from `inference_gpus` (or equal to it: `trainer_memory_share`)."))
    inference_parallel: Literal["tensor", "data"] = pydantic.Field("tensor", description=(
        "vLLM only, with several `inference_gpus`: `tensor` shards each forward over them "
        "(`--tensor-parallel-size N`, for a model one GPU cannot hold or serve fast enough), `data` runs one "
        "engine replica per GPU behind one server (`--data-parallel-size N`, for throughput of a model that "
        "fits one GPU). Default `tensor`."))
    launcher: Literal["local", "ray"] = pydantic.Field("local", description=(
        "`placement='dedicated'` only: who starts the dedicated inference server. Default `local`: a child "
        "process of this one (`CUDA_VISIBLE_DEVICES` from `inference_gpus`). `ray`: a Ray actor "
        "(`ruler_rl.trainer.ray_placement`) scheduled through a STRICT_PACK placement group of one bundle "
        "(`{'GPU': len(inference_gpus), 'CPU': 1}` with vLLM, `{'GPU': gpu_memory_utilization, 'CPU': 1}` on "
        "one GPU shared with the trainer, `{'CPU': 1}` for the transformers engine's CPU form) starts the "
        "server as its child on whichever node Ray places it; Ray sets its "
        "`CUDA_VISIBLE_DEVICES`, so `inference_gpus` gives only the count and Ray picks which GPUs (a local "
        "cluster this process starts is shown only the GPUs not in `trainer_gpus`, all of them when the trainer "
        "shares its GPU or is placed by Ray too). It connects to a running cluster (`ray.is_initialized()` or "
        "`RAY_ADDRESS`), else starts a local one. The trainer stays in this process on `trainer_gpus` unless "
        "`trainer_launcher='ray'`; FSDP over several trainer GPUs is the README's Scale plan, not built. "
        "Needs `pip install 'ruler-rl[ray]'`."))
    trainer_launcher: Literal["local", "ray"] = pydantic.Field("local", description=(
        "Where the trainer side (the LoRA model, its optimizer, each training step and checkpoint) runs. Default "
        "`local`: in this process. `ray`: in a Ray actor (`ruler_rl.trainer.ray_trainer.TrainerActor`) that Ray schedules "
        "through a STRICT_PACK placement group of one bundle (`ruler_rl.trainer.ray_trainer.trainer_bundle`: "
        "`{'GPU': len(trainer_gpus), 'CPU': trainer_cpus}`, `{'GPU': trainer_memory_share, 'CPU': trainer_cpus}` "
        "when the trainer shares its GPU with vLLM, `{'CPU': trainer_cpus}` for the transformers engine's CPU "
        "form); the actor starts the inference server as `launcher='ray'` does (a second actor), and this "
        "process keeps the same user loop (`model.register`, `model.train`, `train_pipelined`), each call "
        "forwarded to the actor. Needs `launcher='ray'`."))
    trainer_cpus: float = pydantic.Field(1.0, gt=0, description=(
        "`trainer_launcher='ray'` only: the CPUs of the trainer's bundle, in Ray's CPU units (Ray also sets the "
        "actor's `OMP_NUM_THREADS`, torch's CPU threads, from it). Default 1.0; > 0."))
    trainer_memory_share: float | None = pydantic.Field(None, gt=0, lt=1, description=(
        "A dedicated vLLM placement on ONE GPU split in two (`inference_gpus == trainer_gpus == [g]`): the "
        "fraction of that GPU's memory the trainer may use. Required then, together with an explicit "
        "`gpu_memory_utilization` (vLLM's fraction); the two must sum to at most 1. The trainer's CUDA caching "
        "allocator is capped at it (`torch.cuda.set_per_process_memory_fraction`) and the memory plan checks the "
        "trainer's phases against it; with `launcher='ray'` the server's Ray bundle asks for "
        "`gpu_memory_utilization` of a GPU, with `trainer_launcher='ray'` the trainer's for this share. Default None (a GPU is never shared); 0 < share < 1. Set without a shared GPU: an error."))
    placement_timeout_s: float = pydantic.Field(120, gt=0, description=(
        "`launcher='ray'` only: how long the placement group may wait for the cluster to have room for its "
        "bundle, in seconds, and how long connecting to the cluster `RAY_ADDRESS` names may take. Default 120; "
        "> 0. Past it, register fails naming the bundle and the cluster's resources (an infeasible bundle would "
        "otherwise wait forever), or the address that did not answer."))

    @pydantic.field_validator("inference_gpus", "trainer_gpus")
    @classmethod
    def _gpu_list(cls, gpus: list[int]) -> list[int]:
        if any(isinstance(g, bool) or g < 0 for g in gpus):
            raise ValueError(f"GPU indices are ints >= 0, got {gpus}")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"a GPU is listed twice: {gpus}")
        return gpus

    @pydantic.model_validator(mode="after")
    def _placement(self) -> EngineConfig:
        lists = [n for n in ("inference_gpus", "trainer_gpus") if getattr(self, n)]
        if self.trainer_launcher == "ray" and self.launcher != "ray":
            raise ValueError("trainer_launcher='ray' places the trainer beside an inference server Ray places: it "
                             f"needs launcher='ray' and placement='dedicated' (got launcher={self.launcher!r}, "
                             f"placement={self.placement!r})")
        if self.trainer_launcher == "local" and "trainer_cpus" in self._changed(["trainer_cpus"]):
            raise ValueError("trainer_cpus only acts with trainer_launcher='ray'")
        if self.placement == "colocated" and self.trainer_memory_share is not None:
            raise ValueError("trainer_memory_share only acts with placement='dedicated' on one shared GPU "
                             "(inference_gpus == trainer_gpus == [g]); colocated, vLLM sleeps while the trainer "
                             "trains and gpu_memory_utilization alone sets vLLM's share")
        if self.launcher != "local" and self.placement != "dedicated":
            raise ValueError(f"launcher={self.launcher!r} launches the dedicated inference server: it needs "
                             f"placement='dedicated' (got placement={self.placement!r})")
        if self.launcher == "local" and "placement_timeout_s" in self._changed(["placement_timeout_s"]):
            raise ValueError("placement_timeout_s only acts with launcher='ray'")
        if self.placement == "colocated":
            if lists:
                raise ValueError(f"{' and '.join(lists)} only act with placement='dedicated'; colocated "
                                 "inference and training share one device")
            return self
        shared = sorted(set(self.inference_gpus) & set(self.trainer_gpus))
        if shared:
            self._check_shared_gpu(shared)
        elif self.trainer_memory_share is not None:
            raise ValueError("trainer_memory_share only acts when inference and trainer share one GPU "
                             "(placement='dedicated' with inference_gpus == trainer_gpus == [g]); here "
                             f"inference_gpus={self.inference_gpus}, trainer_gpus={self.trainer_gpus}")
        if self.engine == "vllm" and len(lists) < 2:
            raise ValueError("placement='dedicated' with engine='vllm' needs both inference_gpus and trainer_gpus "
                             f"(got inference_gpus={self.inference_gpus}, trainer_gpus={self.trainer_gpus})")
        if self.engine == "transformers" and lists:
            raise ValueError("placement='dedicated' on GPUs needs the vLLM engine (engine='vllm'); with "
                             "engine='transformers' the dedicated server is a CPU child process and takes no "
                             f"GPU lists (got {', '.join(lists)})")
        if self.engine == "auto" and len(lists) == 1:
            raise ValueError(f"placement='dedicated': give both inference_gpus and trainer_gpus, or neither "
                             f"(the transformers engine's CPU form); got only {lists[0]}")
        return self

    def _check_shared_gpu(self, shared: list[int]) -> None:
        """The rules of a dedicated placement on one GPU split in two (`shares_gpu`)."""
        if not (self.inference_gpus == self.trainer_gpus and len(shared) == 1):
            raise ValueError(f"placement='dedicated': GPU(s) {shared} are in both inference_gpus and trainer_gpus; "
                             "dedicated devices are disjoint, or exactly one GPU is split in two "
                             "(inference_gpus == trainer_gpus == [g], with trainer_memory_share and "
                             "gpu_memory_utilization), or use placement='colocated' to take turns on one")
        if self.engine == "transformers":
            return  # refused below: GPU lists need vLLM
        if self.trainer_memory_share is None or "gpu_memory_utilization" not in self.model_fields_set:
            given = (self.gpu_memory_utilization if "gpu_memory_utilization" in self.model_fields_set
                     else "unset")
            raise ValueError(f"placement='dedicated' on one GPU split in two (inference_gpus == trainer_gpus == "
                             f"{self.trainer_gpus}) needs both memory shares given: gpu_memory_utilization (vLLM's "
                             "fraction of the GPU) and trainer_memory_share (the trainer's), summing to at most 1, "
                             f"e.g. 0.45 and 0.5 (got gpu_memory_utilization={given}, "
                             f"trainer_memory_share={self.trainer_memory_share})")
        total = self.gpu_memory_utilization + self.trainer_memory_share
        if total > 1 + 1e-9:
            raise ValueError(f"placement='dedicated' on one GPU split in two: gpu_memory_utilization "
                             f"{self.gpu_memory_utilization} + trainer_memory_share {self.trainer_memory_share} = "
                             f"{total:.3g} is more than the whole GPU; lower one so they sum to at most 1")

    @property
    def shares_gpu(self) -> bool:
        """Whether this is a dedicated placement on one GPU split in two: `inference_gpus == trainer_gpus == [g]`
        (vLLM's share `gpu_memory_utilization`, the trainer's `trainer_memory_share`)."""
        return (self.placement == "dedicated" and len(self.trainer_gpus) == 1
                and self.inference_gpus == self.trainer_gpus)

    @pydantic.field_validator("vllm_args")
    @classmethod
    def _no_owned_flags(cls, args: dict[str, Any]) -> dict[str, Any]:
        for key in args:
            flag = vllm_flag_name(key).split(".")[0]  # vLLM's dotted form (`--a-config.field x`) sets the same flag
            if not flag:
                raise ValueError(f"vllm_args: {key!r} is not a flag name")
            if flag in _ENGINE_OWNED_FLAGS and flag not in _OWNED_UNLESS:
                raise ValueError(f"vllm_args[{key!r}] is set by the engine itself; use "
                                 f"{_ENGINE_OWNED_FLAGS[flag]} instead")
        return args

    def chunked_prefill_off(self) -> bool:
        """Whether `vllm_args` turns vLLM's chunked prefill off: `no_enable_chunked_prefill=True`, the one form
        `_chunked_prefill_flags` lets through."""
        return any(vllm_flag_name(key) == "no_enable_chunked_prefill" and value is True
                   for key, value in self.vllm_args.items())

    @property
    def served_length(self) -> int:
        """The context length vLLM serves (`--max-model-len`): `max_model_len`, else `max_seq_length`."""
        return self.max_model_len or self.max_seq_length

    @pydantic.field_validator("vllm_args")
    @classmethod
    def _chunked_prefill_flags(cls, args: dict[str, Any]) -> dict[str, Any]:
        # vLLM's flag takes no value (--enable-chunked-prefill / --no-enable-chunked-prefill) and a False value
        # is never passed on: only True means what it says, and the two together contradict each other
        given = {vllm_flag_name(key): value for key, value in args.items()}
        keys = [k for k in ("enable_chunked_prefill", "no_enable_chunked_prefill") if k in given]
        if len(keys) == 2:
            raise ValueError("vllm_args: give enable_chunked_prefill or no_enable_chunked_prefill, not both")
        if keys and given[keys[0]] is not True:
            raise ValueError(f"vllm_args[{keys[0]!r}] takes True (a flag without a value); to turn chunked "
                             "prefill off give no_enable_chunked_prefill=True")
        return args

    @pydantic.model_validator(mode="after")
    def _batched_tokens(self) -> EngineConfig:
        n = self.max_num_batched_tokens
        if n is None or self.engine == "transformers":  # vLLM-only: the CPU engine warns (_vllm_only_fields)
            return self
        if n < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens={n} is below max_num_seqs={self.max_num_seqs}: vLLM needs "
                             "room for one token of every concurrent sequence in a step; raise it or lower "
                             "max_num_seqs")
        if self.chunked_prefill_off() and n < self.served_length:
            raise ValueError(f"max_num_batched_tokens={n} is below the served context length {self.served_length} with "
                             "chunked prefill off (vllm_args): vLLM must prefill a whole prompt in one step; "
                             "raise it to at least that, or leave it None")
        return self

    @pydantic.model_validator(mode="after")
    def _owned_while_on(self) -> EngineConfig:
        for key in self.vllm_args:
            flag = vllm_flag_name(key).split(".")[0]
            field = _OWNED_UNLESS.get(flag)
            if field is not None and getattr(self, field):
                raise ValueError(f"vllm_args[{key!r}] is set by the engine itself while {field}=True; use "
                                 f"{_ENGINE_OWNED_FLAGS[flag]}")
        return self

    @pydantic.model_validator(mode="after")
    def _vllm_only_fields(self) -> EngineConfig:
        if self.engine == "transformers":
            ignored = sorted(self._changed(_VLLM_ONLY))
            if ignored:
                warnings.warn(f"EngineConfig: {', '.join(ignored)} only act(s) with the vLLM engine; "
                              "engine='transformers' ignores them", UserWarning, stacklevel=2)
        return self


class MemoryCheckConfig(_Strict):
    """The memory plan `LocalBackend.register` makes before loading anything (`ruler_rl.trainer.memory.plan_memory`): an
    estimate of whether rollouts and training fit the device, refused with `ruler_rl.trainer.MemoryPlanError` naming the
    numbers and what to change when they do not."""

    enabled: bool = pydantic.Field(True, description=(
        "Make the plan at register and refuse a run that does not fit. Default True. It runs on a CUDA device, "
        "or anywhere when `device_gib` is set (on the CPU a plan also decides `ModelConfig.gradient_checkpointing=None`, "
        "never refusing); False skips both (for those who know their setup fits better than "
        "the estimate does). `ModelConfig(memory_check=False)` is short for this."))
    device_gib: float | None = pydantic.Field(None, gt=0, description=(
        "Plan as if the device had this many GiB (2^30 bytes) instead of asking CUDA: to size a run for another "
        "GPU, or to leave room for something else. Default None: the device's total memory "
        "(`torch.cuda.mem_get_info`), minus what other processes already use; > 0. Set, the plan also runs on "
        "the CPU (fp32 weights there)."))
    host_gib: float | None = pydantic.Field(None, gt=0, description=(
        "Plan as if this many GiB (2^30 bytes) of CPU memory were free for the weight copies the run keeps on "
        "the host (vLLM's while it sleeps at level 1; the trainer's with `offload_during_rollouts`). Default "
        "None: what the OS reports available at register (psutil). > 0. On the CPU also the memory "
        "`ModelConfig.gradient_checkpointing=None` is decided against."))
    max_tokens_per_micro_batch: int | None = pydantic.Field(None, ge=16, description=(
        "The `TrainConfig.max_tokens_per_micro_batch` the plan assumes, in tokens (register does not know the "
        "TrainConfig of later steps): set it to what the steps will use. A step whose "
        "`TrainConfig.max_tokens_per_micro_batch` is larger is re-planned by `LocalBackend.train`: a warning "
        "naming both numbers, or `MemoryPlanError` before the step when the re-plan does not fit. Default "
        "None: TrainConfig's default (8192); >= 16."))
    margin: float = pydantic.Field(0.1, ge=0, le=1, description=(
        "The fraction of the trainer's own estimated terms (context, weights, LoRA state, activations) added to "
        "the plan for what it does not model (allocator fragmentation, kernel workspaces). Default 0.1; 0-1."))


class ModelConfig(_Strict):
    """Everything about one trainable model other than its name and base model: adapter, engine, memory, seed."""

    lora: LoRAConfig = pydantic.Field(default_factory=LoRAConfig, description=(
        "The LoRA adapter trained on the base model (`LoRAConfig`). Default `LoRAConfig()`: rank 8, alpha 16, "
        "Llama-like projections."))
    engine: EngineConfig = pydantic.Field(default_factory=EngineConfig, description=(
        "The inference engine that serves rollouts (`EngineConfig`). Default `EngineConfig()`: `auto` (vLLM "
        "on a GPU when installed, else transformers), 2048-token sequences."))
    gradient_checkpointing: bool | None = pydantic.Field(None, description=(
        "Recompute activations in the backward pass instead of keeping them (less memory, more compute). "
        "Default None: on for models of 1B parameters or more on a GPU (activations of long agent sequences "
        "dominate memory there); on the CPU, on when the memory plan of one training pass without it (passes of "
        "`memory_check.max_tokens_per_micro_batch`, default 8192 tokens) does not fit 80% of the memory the OS "
        "reports available (`memory_check.host_gib` when set, at most `memory_check.device_gib`; a warning says "
        "so): SmolLM2-135M at the defaults below about 28 GiB available. Off otherwise. Independent of the chunked logprobs, which always avoid the "
        "full [tokens x vocabulary] logits."))
    block_attention: bool = pydantic.Field(True, description=(
        "Run a packed row's blocks (sequences, a shared prefix and its suffixes) as one SDPA call each, causal "
        "kernels included, instead of one masked SDPA call over the row's [T x T] 4-D mask "
        "(`ruler_rl.trainer.attention`). Exact either way; applies to models that use SDPA (the model's attention "
        "implementation becomes `sdpa_blocks`, which is transformers' SDPA where no blocks are given). Default "
        "True; False keeps the 4-D mask."))
    offload_during_rollouts: bool = pydantic.Field(False, description=(
        "Keep the trainer's frozen base weights in CPU memory while a colocated vLLM serves rollouts, and on the "
        "GPU only during training steps (`ruler_rl.trainer.offload`): vLLM's share can then use that memory for its KV "
        "cache. Needs the vLLM engine, `placement='colocated'` and `enable_sleep_mode` (vLLM must free its own "
        "memory while the weights come back); costs two copies of the base weights over the bus per step and "
        "the model's size in host memory. Default False (both copies stay on the GPU)."))
    dtype: Literal["auto", "bfloat16", "float32"] = pydantic.Field("auto", description=(
        "The trainer's weights and compute. Default `auto`: bfloat16 on a GPU, float32 on the CPU. `float32` on a "
        "GPU doubles the weights' memory and makes the trainer's recomputed logprobs agree with a float32 sampler "
        "(the transformers engine samples with the trainer's own weights) instead of differing by bf16 rounding. "
        "With vLLM it is also passed as vLLM's `dtype` unless `EngineConfig.vllm_args` sets one; vLLM in float32 "
        "is refused (its LoRA kernels take bf16/fp16 only): train in float32 beside a bf16 vLLM with "
        "`vllm_args={'dtype': 'bfloat16'}`. The CPU server of a dedicated transformers placement always runs in "
        "float32."))
    seed: int = pydantic.Field(0, description=(
        "Seed of torch's generator when the model is loaded: the LoRA A matrices' initialisation (B starts at "
        "zero) and, after it, dropout. Default 0; any int. Sampling seeds are per request (`seed` in a "
        "chat-completion request)."))
    memory_check: MemoryCheckConfig = pydantic.Field(default_factory=MemoryCheckConfig, description=(
        "The memory plan made at register before anything is loaded (`MemoryCheckConfig`, "
        "`ruler_rl.trainer.memory.plan_memory`): a run that would not fit the device is refused with "
        "`ruler_rl.trainer.MemoryPlanError` naming the numbers and what to change. Default `MemoryCheckConfig()`: on for a "
        "CUDA device. `False` turns it off, `True` is the default."))

    @pydantic.field_validator("memory_check", mode="before")
    @classmethod
    def _memory_check_shorthand(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value


class TrainConfig(_Strict):
    """One training step (`await model.train(groups, config)`).

    Per token the loss is the PPO-clip term on the ratio r = exp(new - old) of the trained token's logprob to its
    sampled one, times the trajectory's advantage (`ruler_rl.group_advantages` of its group's rewards); `loss`
    picks the clip range and how token terms are weighted into one number (`trainer/loss.py` gives each
    normalisation). Micro-batching is by tokens, not by a count of sequences: there is no `micro_batch_size`;
    `max_tokens_per_micro_batch` bounds each forward pass, and gradients of all passes accumulate into one
    optimizer step whose loss equals the whole batch's.
    """

    learning_rate: float = pydantic.Field(5e-5, gt=0, description=(
        "AdamW learning rate for the LoRA parameters, applied from this step on (it may differ per step). "
        "Default 5e-5; > 0. The effective step also scales with "
        "`LoRAConfig.alpha / rank`."))
    loss: LossKind = pydantic.Field("grpo", description=(
        "The loss. `grpo`: clip 1 +- epsilon; each trajectory's trained tokens averaged, then trajectories "
        "averaged. `dr_grpo`: clip 1 +- epsilon; each trajectory's token sum divided by `completion_budget`, "
        "then averaged over trajectories (no length normalisation); advantages not divided by the std unless "
        "`scale_advantages`. `dapo`: clip-higher 1 - epsilon .. 1 + epsilon_high; one mean over all trained "
        "tokens of the batch. Default `grpo`."))
    epsilon: float = pydantic.Field(0.2, gt=0, lt=1, description=(
        "PPO clip range below (and, except under `dapo`, above) 1: ratios outside [1 - epsilon, 1 + epsilon] "
        "get no gradient where clipping binds. Default 0.2; 0 < epsilon < 1."))
    epsilon_high: float = pydantic.Field(0.28, gt=0, description=(
        "`dapo` only: the upper clip bound is 1 + epsilon_high (clip-higher), letting unlikely tokens gain "
        "probability faster. Default 0.28; must be >= epsilon. Set to another value under another loss: an error."))
    kl_coef: float = pydantic.Field(0.0, ge=0, description=(
        "Weight of the k3 KL estimate to the reference policy (the base model: the adapter disabled), added "
        "per token. Default 0.0 (no KL term and no reference forward pass); >= 0. Above 0 each micro-batch "
        "costs one extra forward pass."))
    scale_advantages: bool | None = pydantic.Field(None, description=(
        "Divide each group's centred rewards by the group's std (+1e-6). Default None: yes, except for "
        "`dr_grpo` (whose paper drops it). True/False force it for any loss."))
    max_tokens_per_micro_batch: int = pydantic.Field(8192, ge=16, description=(
        "The most tokens one forward pass holds, in tokens. Default 8192; >= 16. Whole sequences are packed up "
        "to it without padding (one longer sequence gets a pass of its own, so it never splits a sequence); "
        "a group's shared prompt counts once. Lower it when a step runs out of memory; it changes speed and "
        "memory, never the loss or gradients."))
    completion_budget: int | None = pydantic.Field(None, ge=1, description=(
        "`dr_grpo` only: the constant each trajectory's token sum is divided by, in tokens - the most tokens a "
        "trajectory may generate (TRL's max_completion_length). Default None: the largest count of trained "
        "tokens of any trajectory in the batch (so it varies between batches); >= 1. Set under another loss: "
        "an error."))
    share_prefix: bool = pydantic.Field(True, description=(
        "Compute the prompt shared by a group's sequences once per forward pass (`trainer/packing.py`: the "
        "row's blocks as one SDPA call each, `ModelConfig.block_attention`, or a 4-D attention mask). Default "
        "True. Same loss and gradients either way; off, every sequence is computed whole. Attention implementations that take no mask (flash_attention_2) fall back to one "
        "sequence per pass (counted as `unmaskable_fallback`)."))
    min_shared_prefix: int = pydantic.Field(32, ge=1, description=(
        "`share_prefix` only: the shortest shared prompt worth sharing, in tokens; sequences must agree on "
        "their first this-many tokens to be grouped. Default 32; >= 1. Set to another value with share_prefix=False: an error."))
    max_grad_norm: float = pydantic.Field(1.0, gt=0, description=(
        "Clip the global L2 norm of the LoRA gradients to this before the optimizer step. Default 1.0; > 0. "
        "A non-finite norm skips the step with an error (nothing applied)."))
    weight_decay: float = pydantic.Field(0.0, ge=0, description=(
        "AdamW's decoupled weight decay on the LoRA parameters. Default 0.0; >= 0."))
    logprob_chunk_size: int = pydantic.Field(256, ge=1, description=(
        "Trained tokens per chunk when computing logprobs from the last hidden state: only a [chunk x "
        "vocabulary] block of logits exists at a time (recomputed in the backward pass). Default 256; >= 1. "
        "Memory/speed only; unused when the backend falls back to the model's full forward (a model whose "
        "chunked logprobs differ from its own forward)."))
    lora_autocast: bool | None = pydantic.Field(None, description=(
        "Run the adapters' matmuls in the model's bfloat16 under `torch.autocast` (bf16 mixed precision, as a "
        "transformers Trainer with `bf16=True` runs peft's adapters) instead of upcasting each adapted layer's "
        "input to float32 (peft's default outside autocast): the LoRA weights, their gradients and the optimizer "
        "state stay float32. Measured on an H200 (`evals/reports/scale`, agent workload): the training part of a "
        "step 27.7 s with it against 36.1 s without at a 7B shape, 57.0 s against 70.2 s at 14B (a first step); "
        "the trainer's peak 22.4 against 24.7 GiB at 7B, 45.4 against 44.6 GiB at 14B (other steps, other "
        "tokens). Default None: on for a bfloat16 model, off otherwise (float32 and float16 models train as "
        "peft has them). True: on, and a float16 model is refused (its adapters' gradients would need a gradient "
        "scaler); on a float32 model nothing changes. False: off. Whether it was on is in each step's stats "
        "(`lora_autocast`). The transformers engine samples without autocast: on a GPU in bf16 its sampled "
        "logprobs then differ from the trainer's by the adapters' rounding (ratios near 1, not exactly 1)."))
    allow_off_policy_text: bool = pydantic.Field(False, description=(
        "Train choices that carry no served token ids (an API model's answer, a streamed answer): their text "
        "is re-rendered with the served chat template and trained with ratio 1, counted as "
        "`off_policy_turns`. Default False: such a choice is refused with `MissingTokenIdsError`."))
    sampler_correction: Literal["none", "tis"] = pydantic.Field("none", description=(
        "How to treat the mismatch between the sampler's logprobs and the trainer's (vLLM's bf16 kernels: mean "
        "|ratio - 1| ~0.05 measured). `none`: the sampled logprobs are the old policy as they are. `tis`: the "
        "PPO ratio uses the trainer's own logprobs before the update, and each token's policy term is scaled by "
        "min(exp(trainer - sampler), sampler_cap) (truncated importance sampling); costs one extra forward per "
        "micro-batch. With the transformers engine the sampler is the trainer, so the weights are ~1. "
        "Default `none`."))
    sampler_cap: float = pydantic.Field(2.0, gt=0, description=(
        "`sampler_correction='tis'` only: the truncation C of the importance weight min(pi_trainer / "
        "pi_sampler, C). Default 2.0; > 0. Set to another value without `tis`: an error."))
    max_off_policy_steps: int = pydantic.Field(0, ge=0, description=(
        "How many policy steps behind the trainer a trained turn may have been sampled, in steps. Each served "
        "choice carries `policy_step`, the adapter step that sampled it; this step trains the policy at step "
        "S (`await model.get_step()`), so a turn sampled at step s is S - s steps off-policy. Default 0: only "
        "turns sampled by the current policy (today's strict on-policy loop). 1: rollouts for the next step "
        "may be gathered by the step-S policy while step S trains (`ruler_rl.trainer.pipeline`, a dedicated "
        "placement). A trajectory with a turn older than the bound, or sampled by a step newer than the "
        "trainer's, is refused (`StalePolicyError`, naming group, trajectory, its step and the bound; "
        "nothing is applied); turns without a `policy_step` (an API model's, a hand-made choice) are not "
        "checked and are counted as `turns_without_policy_step`; stale turns without sampled logprobs "
        "(constrained ones) get no importance weight and are counted as `stale_turns_uncorrected`. Above 0 it needs "
        "`sampler_correction='tis'`: the decoupled objective (PPO clip against the trainer's own logprobs "
        "before the update, each token weighted by min(pi_trainer / pi_sampler, sampler_cap)) is what corrects "
        "for the stale sampler."))

    @pydantic.model_validator(mode="after")
    def _options_that_act(self) -> TrainConfig:
        given = self._changed(type(self).model_fields)
        needs = (("epsilon_high", self.loss == "dapo", "loss='dapo'"),
                 ("completion_budget", self.loss == "dr_grpo", "loss='dr_grpo'"),
                 ("sampler_cap", self.sampler_correction == "tis", "sampler_correction='tis'"),
                 ("min_shared_prefix", self.share_prefix, "share_prefix=True"))
        for name, acts, condition in needs:
            if name in given and not acts:
                raise ValueError(f"{name} only acts with {condition}; this configuration would ignore it "
                                 f"(leave it unset, or set {condition})")
        if self.max_off_policy_steps > 0 and self.sampler_correction != "tis":
            raise ValueError(f"max_off_policy_steps={self.max_off_policy_steps} trains turns an older policy sampled; "
                             "set sampler_correction='tis' so the loss corrects for it (clip against the trainer's "
                             "own logprobs, weight by the truncated ratio to the sampler's)")
        if self.loss == "dapo" and self.epsilon_high < self.epsilon:
            raise ValueError(f"loss='dapo' clips higher than it clips lower: epsilon_high ({self.epsilon_high}) "
                             f"must be >= epsilon ({self.epsilon})")
        return self

    def scales_advantages(self) -> bool:
        """Whether group advantages are divided by the group's std: `scale_advantages`, or by default every loss
        except `dr_grpo`."""
        return self.loss != "dr_grpo" if self.scale_advantages is None else self.scale_advantages
