"""The scale benchmark's parts on the CPU engine (`--dry-run`), on the `tiny` shape: the pipeline's phases (issue
#13: one registered model trains the plain steps, then the overlapped ones, each step and phase recorded as such),
ours, the sharing and profile passes, TRL's agent workload and vLLM's plain server."""

import json

import pytest

from evals.scale_bench.cli import main
from evals.scale_bench.pipeline import hidden_rollout, parse_phases
from evals.scale_bench.report import pipeline_report


@pytest.fixture(scope="module")
def tiny_weights_dir(tmp_path_factory):
    """The `tiny` shape's model folder with its random weights saved (seed 0): a model `--task tiny` loads as it
    loads SmolLM2, at a fraction of the cost (2 layers of width 32)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from evals.scale_bench.shapes import make_model_dir

    folder = make_model_dir("tiny", tmp_path_factory.mktemp("tiny-weights"))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def test_phases_parse_and_bad_ones_are_refused_by_name():
    assert parse_phases("plain:2,overlap:3") == [("plain", 2), ("overlap", 3)]
    for bad in ("plain", "plain:0", "fast:2", "overlap:x"):
        with pytest.raises(Exception, match="KIND:STEPS"):
            parse_phases(bad)
    with pytest.raises(SystemExit):
        main(["pipeline", "--task", "tiny", "--dry-run", "--phases", "plain:1", "--overlap"])


@pytest.mark.slow  # a dedicated server process and three training steps
def test_plain_then_overlapped_steps_on_one_model(tmp_path, tiny_weights_dir):
    main(["pipeline", "--task", "tiny", "--tiny-model", str(tiny_weights_dir), "--dry-run", "--placement", "dedicated",
          "--phases", "plain:1,overlap:2", "--groups", "2", "--group-size", "4", "--tiny-max-tokens", "8",
          "--out", str(tmp_path)])
    result = json.loads((tmp_path / "pipeline-tiny-dedicated-plain-overlap.json").read_text())
    assert not result["errors"]
    assert [(s["phase"], s["step"]) for s in result["steps"]] == [("plain", 1), ("overlap", 2), ("overlap", 3)]
    # the overlapped phase's second step trained on rollouts its first step's policy sampled while it trained
    assert [s.get("policy_lag_max") for s in result["steps"]] == [0, 0, 1]
    assert [(p["kind"], p["steps"]) for p in result["phase_summary"]] == [("plain", 1), ("overlap", 2)]
    assert result["phase_summary"][0]["steady_step_s"] is None  # a phase's first step is not steady
    assert result["phase_summary"][1]["steady_step_s"] == result["steps"][2]["wall_step_s"]
    # overlap (#35): no rollout hidden in the plain phase; in the overlapped one step 3's gather ran inside step 2
    plain, overlap = result["phase_summary"]
    assert plain["rollout_hidden_s"] == 0 and plain["rollout_hidden_frac"] == 0
    assert 0 < overlap["rollout_hidden_s"] <= overlap["rollout_total_s"] and 0 < overlap["rollout_hidden_frac"] <= 1
    assert (plain["policy_lag_max"], overlap["policy_lag_max"], overlap["policy_lag_mean"]) == (0, 1, 0.5)
    assert overlap["adapter_swap_s_mean"] > 0
    assert overlap["sleep_wake_s_mean"] < 0.01  # the dedicated server never sleeps
    table = pipeline_report(tmp_path)
    assert "| pipeline-tiny-dedicated-plain-overlap | overlap | 2 |" in table and "| 3 | " in table
    with pytest.raises(SystemExit):
        main(["pipeline", "--task", "tiny", "--dry-run", "--ray-trainer", "--out", str(tmp_path)])  # colocated


def test_hidden_rollout_counts_the_seconds_of_gathers_inside_train_calls():
    assert hidden_rollout([(0, 2), (2, 5), (10, 11)], [(2, 4), (5, 10.5)]) == {
        "rollout_total_s": 6, "rollout_hidden_s": 2.5, "rollout_hidden_frac": 2.5 / 6}
    assert hidden_rollout([], [])["rollout_hidden_frac"] is None


@pytest.mark.slow  # trains the tiny model four times
def test_ours_runs_both_workloads_without_an_error_row(tmp_path):
    """The device run's script, on the CPU engine: every train call of the prefix and agent parts trains (a
    TrainConfig the trainer refuses, or rollouts of an older policy step, would be recorded as an error row)."""
    main(["ours", "--shape", "tiny", "--dry-run", "--out", str(tmp_path), "--prefix-tokens", "100",
          "--turn-tokens", "40", "--gen", "8", "--groups", "2", "--group-size", "2", "--agent-steps", "1",
          "--max-seq", "2048", "--micro-tokens", "2048", "--lora-autocast", "alternate"])
    result = json.loads((tmp_path / "ours-tiny.json").read_text())
    assert not result["errors"]
    rows = result["prefix"]["share"] + result["prefix"]["no_share"] + result["agent"]["steps"]
    assert len(rows) == 4 and all("error" not in r and r["trained"] for r in rows)
    assert [r["step"] for r in result["prefix"]["share"] + result["prefix"]["no_share"]] == [1, 3, 2]
    # --lora-autocast alternate: the train calls in order (share, no share, share; then the agent's) off, on, off;
    # the trainer's stat says it did not run (a float32 model on the CPU)
    assert [r["lora_autocast_setting"] for r in rows] == [False, False, True, False]
    assert [r["lora_autocast"] for r in rows] == [False] * 4
    # three rollouts of the base model (the ones `raw` is compared with), then fresh ones before each train call
    assert len(result["prefix"]["rollout_s"]) == 3 and len(result["prefix"]["rollout_adapter_s"]) == 3
    share, plain = result["prefix"]["share"][0], result["prefix"]["no_share"][0]
    assert share["forward_tokens"] < share["sequence_tokens"] and plain["forward_tokens"] == plain["sequence_tokens"]


def test_rollout_part_only_samples_the_base_model(tmp_path):
    """`--parts rollout` (against `raw`): the requested number of base-model rollouts, no train call."""
    main(["ours", "--shape", "tiny", "--dry-run", "--out", str(tmp_path), "--parts", "rollout", "--rollout-reps", "4",
          "--prefix-tokens", "100", "--gen", "4", "--groups", "2", "--group-size", "2", "--max-seq", "1024",
          "--micro-tokens", "1024"])
    result = json.loads((tmp_path / "ours-tiny.json").read_text())
    assert not result["errors"] and "agent" not in result
    assert len(result["prefix"]["rollout_s"]) == 4 and len(result["prefix"]["rollout_tokens_per_s"]) == 4
    assert not {"share", "no_share", "rollout_adapter_s"} & set(result["prefix"])


def test_sharing_part_gives_the_same_loss_with_fewer_forward_tokens(tmp_path):
    main(["sharing", "--shape", "tiny", "--dry-run", "--out", str(tmp_path), "--prefix-tokens", "100", "--gen", "8",
          "--groups", "2", "--group-size", "4", "--micro-tokens", "1024"])
    result = json.loads((tmp_path / "sharing-tiny.json").read_text())
    share, plain, again = result["calls"]
    assert (share["share_prefix"], plain["share_prefix"]) == (True, False)
    assert share["forward_tokens"] == 2 * 100 + 8 * 8 and plain["forward_tokens"] == 8 * (100 + 8)
    assert abs(share["loss"] - plain["loss"]) < 1e-5 and share["loss"] == pytest.approx(again["loss"], abs=1e-7)
    assert share["shared_prefix_groups"] == 2 and plain["shared_prefix_groups"] == 0


@pytest.mark.slow  # two TRL steps
def test_trls_agent_workload_runs_multi_turn_rollouts_through_its_rollout_func(tmp_path):
    """The TRL side of #12's comparison, on the CPU (transformers generation instead of vLLM): three turns per
    rollout, the tool results between them masked out of TRL's loss, every step trained."""
    main(["trl", "--trl-workload", "agent", "--shape", "tiny", "--dry-run", "--out", str(tmp_path),
          "--turn-tokens", "20", "--gen", "4", "--groups", "2", "--group-size", "2", "--turns", "3",
          "--trl-steps", "2", "--trl-per-device", "2", "--max-seq", "512"])
    result = json.loads((tmp_path / "trl-agent-tiny.json").read_text())
    assert not result["errors"] and len(result["step_s"]) == 2
    assert len(result["trl_rollout_turn_s"]) == 2 * 3  # one generation call per turn and step
    steps = [row for row in result["log"] if "loss" in row]
    assert len(steps) == 2 and all(row["grad_norm"] > 0 for row in steps)
    # TRL counts only the sampled tokens (env_mask 1): 3 turns x 4; the completions also hold the tool results
    assert all(row["completions/mean_length"] == 12 for row in steps)
    assert all(n > 12 + 2 * 20 for lengths in result["trl_completion_tokens"] for n in lengths)


def test_time_by_kind_splits_kernels_into_matmul_attention_and_the_rest():
    from evals.scale_bench.profile import time_by_kind

    kinds = time_by_kind([("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 2.0), ("nvjet_tst_192x192_64x3_2x1_v_bz", 1.0),
                          ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", 0.5),
                          ("fmha_cutlassB_bf16_aligned_64x64_k128_sm80", 0.25), ("aten::mm", 0.125),
                          ("void gemv2T_kernel_val<int, int, __nv_bfloat16>", 0.5),
                          ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 0.25),
                          ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>", 0.0625)])
    assert kinds == {"matmul": 3.625, "attention": 1.0, "other": 0.0625}
    with pytest.raises(TypeError, match="pairs"):
        time_by_kind([("aten::mm", "1 ms")])


@pytest.mark.slow  # three profiled training passes
def test_profile_part_times_one_sequence_and_a_packed_row(tmp_path):
    main(["profile", "--shape", "tiny", "--dry-run", "--out", str(tmp_path), "--act-tokens", "64",
          "--prof-sequences", "1,2", "--act-checkpointing", "on", "--prof-reps", "1"])
    result = json.loads((tmp_path / "profile-tiny.json").read_text())
    assert result["errors"] == []
    one, two, blocks = result["runs"]  # one sequence (no mask either way), two with the mask, two as blocks
    assert (one["sequences"], two["sequences"], blocks["sequences"]) == (1, 2, 2)
    assert (two["attention"], blocks["attention"]) == ("mask", "blocks")
    assert (two["rows_as_blocks"], blocks["rows_as_blocks"]) == (0, 1)
    assert blocks["loss"] == pytest.approx(two["loss"], abs=1e-5) and two["loss"] != 0  # same row, same weights
    assert one["rows"] == two["rows"] == 1 and one["forward_tokens"] == two["forward_tokens"] == 64  # packed: one row
    for run in (one, two, blocks):
        assert run["s"] > 0 and run["tokens_per_s"] == pytest.approx(64 / run["s"])
        assert sum(run["by_kind_s"].values()) == pytest.approx(run["device_busy_s"])
        assert run["by_kind_s"]["matmul"] > 0  # the linear layers' aten::mm/addmm on the CPU
        assert any(t["name"] in ("aten::mm", "aten::addmm", "aten::bmm") for t in run["top"])


def test_the_plain_server_is_ours_without_the_middleware(tmp_path):
    """`raw --raw-via server` isolates the middleware: vLLM's server with exactly ours' flags but for it."""
    import argparse

    from evals.scale_bench.raw import plain_vllm_server
    from evals.scale_bench.shapes import make_model_dir
    from ruler_rl.trainer.vllm_server import VLLMServer

    args = argparse.Namespace(max_seq=2048, util=0.45, batched_tokens=12288, log_stats=False)
    model_dir = make_model_dir("tiny", tmp_path / "m")
    plain = plain_vllm_server(model_dir, args, tmp_path)
    assert plain.chat_template_file is not None  # the template the trainer picks for SmolLM2's tokenizer
    ours = VLLMServer(str(model_dir), plain.config, served_name="raw", lora_rank=16, log_dir=tmp_path,
                      chat_template_file=plain.chat_template_file, tool_parser="hermes", reasoning_parser=None,
                      port=plain.port, tools_ok=plain.tools_ok)
    mine, theirs = plain.command(), ours.command()
    at = theirs.index("--middleware")
    assert "--middleware" not in mine and mine == theirs[:at] + theirs[at + 2:]
    assert mine[mine.index("--load-format") + 1] == "dummy" and "--enable-sleep-mode" in mine
    assert mine[mine.index("--max-num-batched-tokens") + 1] == "12288" and "--disable-log-stats" in mine
    assert "RULER_SERVED_NAME" not in plain.environment({}) and "RULER_SERVED_NAME" in ours.environment({})


def test_raw_server_part_times_each_request_kind(tmp_path):
    main(["raw", "--raw-via", "server", "--shape", "tiny", "--dry-run", "--out", str(tmp_path), "--prefix-tokens",
          "100", "--gen", "4", "--groups", "2", "--group-size", "2", "--max-seq", "1024", "--rollout-reps", "2"])
    result = json.loads((tmp_path / "raw-server-tiny.json").read_text())
    assert set(result["kinds"]) == {"plain", "as_middleware"}
    assert all(len(runs) == 2 and all(r["s"] > 0 and r["tokens_per_s"] > 0 for r in runs)
               for runs in result["kinds"].values())
    with pytest.raises(SystemExit):
        main(["raw", "--shape", "tiny", "--dry-run", "--out", str(tmp_path)])
