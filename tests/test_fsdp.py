"""The LoRA model under FSDP2 (`trainer/fsdp.py`) at world size 1: `torchrun --nproc_per_node 1` on the CPU (gloo)
runs one `train_step` on the sharded model and the same step unsharded; they must agree exactly, every parameter
sharded (a DTensor) and the LoRA weights moved. `shard`'s refusals in-process."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ruler_rl.trainer.fsdp import TINY, _build, shard

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_one_fsdp_step_at_world_size_one_equals_the_unsharded_step(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    out = tmp_path / "fsdp.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "1", "-m", "ruler_rl.trainer.fsdp",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 1 and result["device"] == "cpu" and result["same_names"]
    assert result["sharded_parameters"] == result["parameters"] > 0  # every parameter a DTensor of the mesh
    assert result["lora_moved"] > 1e-3  # the step changed the adapter (lr 1e-2)
    assert result["loss_fsdp"] == pytest.approx(result["loss_plain"], abs=1e-6)
    assert result["grad_norm_fsdp"] == pytest.approx(result["grad_norm_plain"], rel=1e-5)
    assert result["max_lora_difference"] <= 1e-6


def test_shard_refuses_without_a_process_group_and_a_tied_head(tmp_path):
    import torch.distributed as dist

    model = _build(None, 0, "cpu")
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        shard(model)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(TypeError, match="must be a peft model"):
            shard(model.get_base_model())
        from transformers import AutoModelForCausalLM, LlamaConfig

        from ruler_rl.trainer.config import LoRAConfig

        settings = {k: v for k, v in TINY.items() if k != "architectures"}
        tied = AutoModelForCausalLM.from_config(LlamaConfig(**{**settings, "tie_word_embeddings": True}))
        with pytest.raises(ValueError, match="ties its head to its embeddings"):
            shard(LoRAConfig(rank=4).wrap(tied, "tied"))
    finally:
        dist.destroy_process_group()
