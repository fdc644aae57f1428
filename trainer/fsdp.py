"""The trainer's LoRA model under torch FSDP2 (`torch.distributed.fsdp.fully_shard`): the first piece of the
README's Scale plan for several trainer GPUs, checked at world size 1.

    # CPU (gloo), a tiny random Llama
    torchrun --standalone --nproc_per_node 1 -m ruler_rl.trainer.fsdp --out fsdp.json
    # a model folder; CUDA (nccl) when a GPU is visible
    torchrun --standalone --nproc_per_node 1 -m ruler_rl.trainer.fsdp --base DIR --out fsdp.json

`shard(peft_model, mesh)` puts the FSDP units where the trainer's step calls the model: each decoder layer, the
decoder (the embeddings and final norm), and the language-model head on its own, because the chunked logprobs
(`ruler_rl.trainer.training._row_logprobs`) call the decoder and then `lm_head` separately, not the root forward; the
root holds the rest. A model whose head shares its weight with the embeddings (`tie_word_embeddings`) is
refused: one parameter cannot belong to two units, and the head is called outside the decoder's.

`main()` (one process per rank, under `torchrun`) runs one `ruler_rl.trainer.training.train_step` of a fixed batch on
the sharded model and, on rank 0, the same step on an unsharded copy built from the same seed, and writes both losses,
the largest difference between the two updated LoRA weights and whether the LoRA weights moved. At world
size 1 the two must agree (sharding over one rank changes where tensors live, not the arithmetic); above 1 each
rank trains the whole batch here (the batch is not split across ranks yet), so this checks the sharding
mechanics, not a data-parallel step.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 256, "tie_word_embeddings": False, "rms_norm_eps": 1e-6}


def shard(peft_model, mesh=None):
    """`peft_model` (a peft LoRA model over a transformers causal LM) sharded in place with FSDP2 over `mesh`
    (a 1-D `DeviceMesh`; None: the default process group's): every decoder layer, the decoder, the head and the
    root, each a unit. Returns the model. Needs `torch.distributed` initialised; a tied head is a ValueError."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("shard needs torch.distributed initialised (run under torchrun: "
                           "torch.distributed.init_process_group)")
    if not hasattr(peft_model, "get_base_model"):
        raise TypeError(f"peft_model must be a peft model (LoRAConfig.wrap), got {type(peft_model).__name__}")
    base = peft_model.get_base_model()
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    if head is None or head.weight is base.get_input_embeddings().weight:
        raise ValueError("the model ties its head to its embeddings (tie_word_embeddings): the chunked logprobs call "
                         "the head outside the decoder, and one parameter cannot belong to two FSDP units")
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(decoder).__name__} has no `layers`: not a Llama-like decoder")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(decoder, mesh=mesh)
    fully_shard(head, mesh=mesh)
    fully_shard(peft_model, mesh=mesh)
    return peft_model


def _build(base: str | None, seed: int, device: str, random_weights: bool = False):
    """The LoRA model of `base` (a folder, its weights or with `random_weights` its config only; None: `TINY`'s
    random Llama), seeded, in float32 on `device`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    from ruler_rl.trainer.config import LoRAConfig

    torch.manual_seed(seed)
    if base is None:
        hf = AutoModelForCausalLM.from_config(LlamaConfig(**{k: v for k, v in TINY.items() if k != "architectures"}),
                                              dtype=torch.float32)
    elif random_weights:
        with torch.device(device):
            hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base), dtype=torch.float32)
    else:
        hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    hf.to(device)
    return LoRAConfig(rank=8, alpha=16.0).wrap(hf, base or "tiny")


def _batch(vocab: int, seed: int):
    """Two sequences of one group, rewarded apart (advantages -1 and 1), their second halves trained."""
    import random

    from ruler_rl.trainer.sequences import TrainingSequence

    rng = random.Random(seed)
    seqs = []
    for i, advantage in enumerate((-1.0, 1.0)):
        ids = [rng.randrange(vocab) for _ in range(24)]
        trained = [k >= 12 for k in range(24)]
        seqs.append(TrainingSequence(ids, trained, [-1.0 if t else float("nan") for t in trained], turns=1,
                                     advantage=advantage, trajectory=i, group=0, position=i))
    return seqs


def _lora(model) -> dict:
    """The LoRA weights, whole (a DTensor gathered), on the CPU."""
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[name] = full.detach().to("cpu", copy=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="one LoRA training step under FSDP2 against the same step unsharded")
    parser.add_argument("--base", default=None, help="a model folder (untied head); default: a tiny random Llama")
    parser.add_argument("--random-weights", action="store_true",
                        help="with --base: build the model from its config.json, seeded (no weights read)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file rank 0 writes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.random_weights and args.base is None:
        parser.error("--random-weights builds --base's config: give --base")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from ruler_rl.trainer.config import TrainConfig
    from ruler_rl.trainer.training import train_step

    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun: torchrun --nproc_per_node N -m ruler_rl.trainer.fsdp --out FILE")
    cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
        config = TrainConfig(learning_rate=1e-2)
        model = shard(_build(args.base, args.seed, device, args.random_weights), mesh)
        before = _lora(model)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
        vocab = model.get_base_model().config.vocab_size
        stats = train_step(model, optimizer, _batch(vocab, args.seed), config)
        after = _lora(model)
        sharded = sum(type(p).__name__ == "DTensor" for p in model.parameters())
        result = {"world_size": world, "device": device, "loss_fsdp": stats["loss"],
                  "grad_norm_fsdp": stats["grad_norm"],
                  "sharded_parameters": sharded, "parameters": sum(1 for _ in model.parameters()),
                  "lora_moved": max((after[k] - before[k]).abs().max().item() for k in after)}
        if rank == 0:
            plain = _build(args.base, args.seed, device, args.random_weights)
            plain_opt = torch.optim.AdamW([p for p in plain.parameters() if p.requires_grad], lr=config.learning_rate)
            plain_stats = train_step(plain, plain_opt, _batch(vocab, args.seed), config)
            reference = _lora(plain)
            result.update(loss_plain=plain_stats["loss"], grad_norm_plain=plain_stats["grad_norm"],
                          max_lora_difference=max((after[k] - reference[k]).abs().max().item() for k in after),
                          same_names=sorted(after) == sorted(reference))
            args.out.write_text(json.dumps(result, indent=1))
            print(json.dumps(result), flush=True)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
