"""The benchmark's model shapes (the public config.json numbers of each model) and their folders: a shape's
config.json, SmolLM2's tokenizer and a generation_config.json, no weights."""

from __future__ import annotations

import json
from pathlib import Path

_QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
         "attention_dropout": 0.0, "initializer_range": 0.02, "max_position_embeddings": 32768,
         "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "sliding_window": 131072, "use_sliding_window": False,
         "tie_word_embeddings": False, "vocab_size": 152064, "use_cache": True}
# The public config.json of each model (Hugging Face hub, *-Instruct): what sets memory and compute.
SHAPES: dict[str, dict] = {
    "qwen2.5-7b": {**_QWEN, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "max_window_layers": 28},
    "qwen2.5-14b": {**_QWEN, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48,
                    "num_attention_heads": 40, "num_key_value_heads": 8, "max_window_layers": 48},
    "qwen2.5-32b": {**_QWEN, "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
                    "num_attention_heads": 40, "num_key_value_heads": 8, "max_window_layers": 64},
    "llama-3.1-8b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                     "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rope_theta": 500000.0,
                     "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                     "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "attention_bias": False,
                     "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
                     "pretraining_tp": 1, "use_cache": True},
    # a CPU check of this script (not a real model)
    "tiny": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 32,
             "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 49152, "max_position_embeddings": 16384, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
             "tie_word_embeddings": False},
}
# per shape: vLLM's share of the GPU (the trainer's bf16 copy sits beside it)
GPU_UTIL = {"qwen2.5-7b": 0.45, "llama-3.1-8b": 0.45, "qwen2.5-14b": 0.55, "qwen2.5-32b": 0.5, "tiny": 0.2}
LORA = {"rank": 16, "alpha": 32.0}
SMOLLM2_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "chat_template.jinja")


def default_tokenizer_dir() -> str:
    gpu = Path("/tmp/models/SmolLM2-135M-Instruct")
    if gpu.is_dir():
        return str(gpu)
    from ruler_rl.judges.embedded import embedded_model_path

    return str(embedded_model_path())


def make_model_dir(shape: str, directory: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
    """A folder with `shape`'s config.json, SmolLM2's tokenizer files and a generation_config.json (no
    weights): what `LocalBackend(random_weights=True)` and vLLM's `--load-format dummy` start from."""
    import shutil

    from transformers import AutoTokenizer

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    out = Path(directory)
    src = Path(tokenizer_dir or default_tokenizer_dir())
    if not src.is_dir():
        raise FileNotFoundError(f"tokenizer folder {src} does not exist")
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(src)
    if len(tok) > SHAPES[shape]["vocab_size"]:
        raise ValueError(f"the tokenizer's {len(tok)} ids do not fit {shape}'s vocabulary")
    for name in SMOLLM2_TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    (out / "config.json").write_text(json.dumps({**SHAPES[shape], **ids, "torch_dtype": "bfloat16"}, indent=1))
    (out / "generation_config.json").write_text(json.dumps({**ids, "do_sample": True}, indent=1))
    return out



def param_count(config: dict) -> int:
    h, i, L, v = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], config["vocab_size"]
    head = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head
    attn = h * h * 2 + h * kv * 2 + (h + 2 * kv if config["model_type"] == "qwen2" else 0)
    per_layer = attn + 3 * h * i + 2 * h
    return L * per_layer + v * h * (1 if config.get("tie_word_embeddings") else 2) + h

