"""The Engine protocol as LocalBackend drives it. vLLM does not run on this machine: `VLLMServer`'s control calls
(adapter load/unload, sleep, wake) go over real HTTP on loopback to a scripted stand-in for vLLM's server, and the
backend trains the real tiny model with it, never asking which engine it holds."""

import os
import threading
from pathlib import Path

import pytest
from openai.types.chat.chat_completion import Choice

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
from ruler_rl.trainer import checkpoints as ckpt
from ruler_rl.trainer.engine import Engine, GeneratingEngine, Sample
from ruler_rl.trainer.vllm_server import VLLMServer
from tests.scripted_vllm import ScriptedVLLM

BASE = "local/smollm2-135m-instruct"
MSGS = [{"role": "user", "content": "Capital of France?"}]


async def test_both_engines_implement_the_protocol_and_only_the_transformers_one_generates_in_process(tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ruler_rl.trainer.engine_transformers import TransformersEngine

    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))
    cpu = TransformersEngine(tiny, None, threading.Lock(), stop_token_ids=[2])
    gpu = VLLMServer("some/model", EngineConfig(), served_name="m", lora_rank=8, log_dir=tmp_path,
                     chat_template_file=None, tool_parser="hermes", reasoning_parser=None, port=8123)
    assert isinstance(cpu, GeneratingEngine) and cpu.base_url is None and not cpu.can_sleep
    assert isinstance(gpu, Engine) and not isinstance(gpu, GeneratingEngine)
    assert gpu.base_url == "http://127.0.0.1:8123/v1" and gpu.can_sleep
    no_port = VLLMServer("some/model", EngineConfig(enable_sleep_mode=False), served_name="m", lora_rank=8,
                         log_dir=tmp_path, chat_template_file=None, tool_parser="hermes", reasoning_parser=None)
    assert not no_port.can_sleep and isinstance(no_port, Engine)  # a free port is picked at construction
    assert no_port.base_url.startswith("http://127.0.0.1:") and no_port.port > 0
    with pytest.raises(ValueError, match="rank"):
        VLLMServer("some/model", EngineConfig(), served_name="m", lora_rank=600, log_dir=tmp_path,
                   chat_template_file=None, tool_parser="hermes", reasoning_parser=None)
    with pytest.raises(TypeError, match="EngineConfig"):
        VLLMServer("some/model", {"engine": "vllm"}, served_name="m", lora_rank=8, log_dir=tmp_path,
                   chat_template_file=None, tool_parser="hermes", reasoning_parser=None)
    with pytest.raises(ValueError, match="end-of-turn"):
        TransformersEngine(tiny, None, stop_token_ids=[])
    # the in-process engine's samples: one logprob per token, a finish reason, top alternatives when asked
    torch.manual_seed(0)
    samples = await cpu.generate([1, 5, 7], n=2, max_tokens=4, top_logprobs=3)
    assert len(samples) == 2
    for s in samples:
        assert 1 <= len(s.token_ids) == len(s.logprobs) == len(s.top_logprobs) <= 4
        assert s.finish_reason == ("stop" if s.token_ids[-1] == 2 else "length")
        assert all(len(top) == 3 and top[0][1] >= top[-1][1] for top in s.top_logprobs)
    with pytest.raises(ValueError, match="prompt_ids"):
        await cpu.generate([], n=1)
    with pytest.raises(ValueError, match="one logprob per token"):
        Sample([1, 2], [-0.1], "stop")
    with pytest.raises(ValueError, match="finish_reason"):
        Sample([1], [-0.1], "abort")


async def test_vllm_server_control_calls_keep_the_recent_adapters_and_refuse_sleep_without_sleep_mode(tmp_path):
    ScriptedVLLM.calls = []
    engine = ScriptedVLLM("some/model", EngineConfig(keep_adapters=2), served_name="m", lora_rank=8,
                          log_dir=tmp_path, chat_template_file=None, tool_parser="hermes", reasoning_parser=None)
    with pytest.raises(RuntimeError, match="not started"):
        await engine.load_adapter(1, tmp_path)
    await engine.start()
    try:
        for step in (1, 2, 3):
            await engine.load_adapter(step, tmp_path / f"{step:04d}")
        await engine.sleep()
        await engine.wake()
        paths = [p for p, _ in ScriptedVLLM.calls]
        assert paths == ["/v1/load_lora_adapter", "/v1/load_lora_adapter", "/v1/load_lora_adapter",
                         "/v1/unload_lora_adapter", "/sleep", "/wake_up"]
        assert '"m@3"' in ScriptedVLLM.calls[2][1] and '"m@1"' in ScriptedVLLM.calls[3][1]
        assert "level=1" in ScriptedVLLM.calls[4][1] and "mode=wait" in ScriptedVLLM.calls[4][1]
        assert engine.loaded == [2, 3]
        with pytest.raises(RuntimeError, match="HTTP 404"):
            await engine.load_adapter(4, "/missing")
        with pytest.raises(ValueError, match="step"):
            await engine.load_adapter(-1, tmp_path)
        engine.config = EngineConfig(enable_sleep_mode=False)
        with pytest.raises(RuntimeError, match="sleep mode"):
            await engine.sleep()
    finally:
        await engine.close()
        await engine.close()  # closing twice is fine


def served_choice(tokenizer, text: str) -> Choice:
    """A choice as vLLM's server (through the middleware) answers it: served prompt and completion ids."""
    prompt = tokenizer.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
        prompt = prompt["input_ids"]
    completion = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return Choice.model_validate({"index": 0, "finish_reason": "stop", "logprobs": None,
                                  "message": {"role": "assistant", "content": text},
                                  "prompt_token_ids": list(prompt), "token_ids": completion})


@pytest.mark.slow
@pytest.mark.parametrize("sleep_mode", [True, False])
async def test_the_backend_drives_an_engine_with_its_own_server_through_the_protocol(tmp_path, monkeypatch,
                                                                                      sleep_mode):
    """An engine with its own base_url: rollouts go there (no CPU server), each step sleeps and wakes it only
    when it can sleep, then loads the new adapter; a resumed run loads its checkpoint's adapter on start."""
    from ruler_rl.trainer import vllm_server

    monkeypatch.setattr(vllm_server, "VLLMServer", ScriptedVLLM)
    ScriptedVLLM.calls = []
    cfg = ModelConfig(engine=EngineConfig(engine="vllm", keep_adapters=1, enable_sleep_mode=sleep_mode))
    model = TrainableModel("v", "p", BASE, cfg)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    try:
        engine = backend._runs["v"].engine
        assert isinstance(engine, ScriptedVLLM) and model.inference_base_url == engine.base_url
        assert backend._server is None and ScriptedVLLM.calls == []
        tok = backend._runs["v"].tokenizer
        for step in (1, 2):
            group = TrajectoryGroup([Trajectory(messages_and_choices=[*MSGS, served_choice(tok, text)], reward=r)
                                     for text, r in (("Paris.", 1.0), ("Lyon, I think.", 0.0))])
            row = await model.train([group], TrainConfig(learning_rate=1e-4))
            assert row["trained"] and row["step"] == step and row["turns_without_logprobs"] == 2
        paths = [p for p, _ in ScriptedVLLM.calls]
        per_step = (["/sleep", "/wake_up"] if sleep_mode else []) + ["/v1/load_lora_adapter"]
        assert paths == per_step + per_step + ["/v1/unload_lora_adapter"]
        loads = [body for p, body in ScriptedVLLM.calls if p == "/v1/load_lora_adapter"]
        assert '"v@2"' in loads[1] and str(ckpt.checkpoint_dir(model.run_dir, 2)) in loads[1]
    finally:
        await backend.close()
    ScriptedVLLM.calls = []
    again = TrainableModel("v", "p", BASE, cfg)
    backend = LocalBackend(tmp_path)
    await again.register(backend)
    try:
        assert await again.get_step() == 2
        assert [p for p, _ in ScriptedVLLM.calls] == ["/v1/load_lora_adapter"] and '"v@2"' in ScriptedVLLM.calls[0][1]
    finally:
        await backend.close()


def dedicated_server(tmp_path, **engine) -> VLLMServer:
    cfg = EngineConfig(engine="vllm", placement="dedicated", **engine)
    return VLLMServer("some/model", cfg, served_name="m", lora_rank=8, log_dir=tmp_path, chat_template_file=None,
                      tool_parser="hermes", reasoning_parser=None, port=8000)


def test_a_dedicated_vllm_server_runs_on_its_own_gpus_with_vllms_parallel_flags_and_never_sleeps(tmp_path):
    colocated = VLLMServer("some/model", EngineConfig(engine="vllm"), served_name="m", lora_rank=8, log_dir=tmp_path,
                           chat_template_file=None, tool_parser="hermes", reasoning_parser=None, port=8000)
    argv, env = colocated.command(), colocated.environment({"PATH": "/bin"})
    assert "--enable-sleep-mode" in argv and colocated.can_sleep and "CUDA_VISIBLE_DEVICES" not in env
    assert "--tensor-parallel-size" not in argv and env["RULER_SERVED_NAME"] == "m" and env["PATH"] == "/bin"

    one = dedicated_server(tmp_path, inference_gpus=[1], trainer_gpus=[0])
    argv, env = one.command(), one.environment({"PATH": "/bin"})
    assert not one.can_sleep and "--enable-sleep-mode" not in argv
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert not any(a in argv for a in ("--tensor-parallel-size", "--data-parallel-size"))

    tp = dedicated_server(tmp_path, inference_gpus=[2, 3], trainer_gpus=[0, 1])
    argv, env = tp.command(), tp.environment({})
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and env["CUDA_VISIBLE_DEVICES"] == "2,3"
    dp = dedicated_server(tmp_path, inference_gpus=[1, 2, 3], trainer_gpus=[0], inference_parallel="data")
    argv = dp.command()
    assert argv[argv.index("--data-parallel-size") + 1] == "3" and "--tensor-parallel-size" not in argv
    # indices are this process's: mapped through its own CUDA_VISIBLE_DEVICES to the GPUs they name
    assert tp.environment({"CUDA_VISIBLE_DEVICES": "4,5,6,7"})["CUDA_VISIBLE_DEVICES"] == "6,7"
    with pytest.raises(ValueError, match=r"GPU index\(es\) \[2, 3\] are beyond"):
        tp.environment({"CUDA_VISIBLE_DEVICES": "4,5"})


def test_dedicated_gpus_are_checked_against_the_machine_before_anything_starts():
    from ruler_rl.trainer.backend import LocalBackend
    from ruler_rl.trainer.vllm_server import check_gpus

    cfg = EngineConfig(engine="vllm", placement="dedicated", inference_gpus=[1], trainer_gpus=[0])
    check_gpus(cfg, 2)
    check_gpus(EngineConfig(), 0)  # colocated: nothing to check
    with pytest.raises(ValueError, match=r"GPU\(s\) \[2\] do not exist; 2 CUDA device\(s\) are visible"):
        check_gpus(cfg.model_copy(update={"inference_gpus": [2]}), 2)
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        check_gpus(cfg, 0)
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        LocalBackend._trainer_device(cfg, "vllm", False)
    auto = EngineConfig(placement="dedicated", inference_gpus=[1], trainer_gpus=[0])  # auto without vLLM
    with pytest.raises(ValueError, match="needs the vLLM engine, and vLLM is not available here"):
        LocalBackend._trainer_device(auto, "transformers", False)
    assert LocalBackend._trainer_device(EngineConfig(engine="transformers", placement="dedicated"), "transformers",
                                        False) == "cpu"


def test_the_rollout_server_schedules_as_vllms_batch_engine_and_collects_no_per_step_statistics(tmp_path):
    from ruler_rl.trainer.vllm_server import rollout_batched_tokens

    gib = 2**30
    # vLLM 0.24's offline (vllm.LLM) defaults: 16384 on 70+ GiB GPUs but the A100, 8192 elsewhere
    assert rollout_batched_tokens(141 * gib, "NVIDIA H200") == 16384
    assert rollout_batched_tokens(80 * gib, "NVIDIA H100 80GB HBM3") == 16384
    assert rollout_batched_tokens(80 * gib, "NVIDIA A100-SXM4-80GB") == 8192
    assert rollout_batched_tokens(24 * gib, "NVIDIA L4") == 8192
    for bad in (0, -1, True, 1.5e11):
        with pytest.raises(ValueError, match="total_bytes"):
            rollout_batched_tokens(bad, "NVIDIA H200")

    def argv(**engine):
        return VLLMServer("some/model", EngineConfig(engine="vllm", **engine), served_name="m", lora_rank=8,
                          log_dir=tmp_path, chat_template_file=None, tool_parser="hermes", reasoning_parser=None,
                          port=8000).command()

    given = argv(max_num_batched_tokens=32768)
    assert given[given.index("--max-num-batched-tokens") + 1] == "32768" and "--disable-log-stats" in given
    assert "--disable-log-stats" not in argv(max_num_batched_tokens=4096, log_stats=True)
    # without CUDA in this process the engine leaves vLLM its own choice rather than guess the serving GPU
    import torch

    assert ("--max-num-batched-tokens" in argv()) == torch.cuda.is_available()
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(engine="vllm", vllm_args={"max_num_batched_tokens": 8192})
    # vLLM refuses a step budget below max_num_seqs, and below the context with chunked prefill off: said here
    with pytest.raises(ValueError, match="max_num_batched_tokens=100 is below max_num_seqs=256"):
        EngineConfig(engine="vllm", max_num_batched_tokens=100)
    with pytest.raises(ValueError, match="below the served context length 10240 with chunked prefill off"):
        EngineConfig(engine="vllm", max_num_batched_tokens=8192, max_seq_length=10240,
                     vllm_args={"no_enable_chunked_prefill": True})
    EngineConfig(engine="vllm", max_num_batched_tokens=8192, max_seq_length=10240)  # chunked prefill on: fine
    with pytest.warns(UserWarning, match="max_num_batched_tokens"):  # vLLM-only: the CPU engine warns, never refuses
        EngineConfig(engine="transformers", max_num_batched_tokens=100)
    # chunked prefill is turned off one way only (vLLM's flag takes no value, and a False flag is never passed)
    for bad in ({"enable_chunked_prefill": False}, {"no_enable_chunked_prefill": "true"},
                {"enable-chunked-prefill": "false"}, {"enable_chunked_prefill": True, "no_enable_chunked_prefill": True}):
        with pytest.raises(ValueError, match="chunked"):
            EngineConfig(engine="vllm", vllm_args=bad)
    with pytest.raises(ValueError, match="log_stats"):
        EngineConfig(engine="vllm", vllm_args={"disable-log-stats": True})


def test_schema_bound_json_is_compact_by_default_in_the_served_and_the_in_process_engine(tmp_path):
    """vLLM 0.24's JSON grammar allows any whitespace between tokens, and a 1.5B self-judge wrote newlines after
    `"scores": [` until its token limit (2026-12-07): both vLLM engines ask for compact JSON unless told not to."""
    import json

    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    from ruler_rl.judges.vllm_engine import engine_args
    from ruler_rl.judges.vllm_settings import COMPACT_JSON
    from ruler_rl.prompt import response_schema

    def argv(**engine):
        return VLLMServer("some/model", EngineConfig(engine="vllm", **engine), served_name="m", lora_rank=8,
                          log_dir=tmp_path, chat_template_file=None, tool_parser="hermes", reasoning_parser=None,
                          port=8000).command()

    given = argv()
    assert json.loads(given[given.index("--structured-outputs-config") + 1]) == COMPACT_JSON
    assert "--structured-outputs-config" not in argv(compact_json=False)  # vLLM's own settings
    for own in ({"structured-outputs-config": {"backend": "guidance"}}, {"structured_outputs_config.backend": "guidance"}):
        with pytest.raises(ValueError, match="compact_json"):  # the dotted form sets the same flag
            EngineConfig(engine="vllm", vllm_args=own)
        theirs = argv(compact_json=False, vllm_args=own)  # off: the user's own settings reach vLLM, once
        assert sum(a.startswith("--structured-outputs-config") for a in theirs) == 1
    # vLLM's dotted form: dashes in the flag only, the field as vLLM names it, a value always (read as JSON)
    dotted = argv(compact_json=False, vllm_args={"structured_outputs_config.disable_any_whitespace": True,
                                                 "compilation-config.use_cudagraph": False,
                                                 "structured_outputs_config.backend": "xgrammar"})
    for flag, value in (("--structured-outputs-config.disable_any_whitespace", "true"),
                        ("--compilation-config.use_cudagraph", "false"),
                        ("--structured-outputs-config.backend", '"xgrammar"')):
        assert dotted[dotted.index(flag) + 1] == value
    with pytest.warns(UserWarning, match="compact_json"):
        EngineConfig(engine="transformers", compact_json=False)
    # the in-process judge engine: the same default, a user's own setting kept, a bad variable named
    assert engine_args({})["structured_outputs_config"] == COMPACT_JSON
    assert engine_args({"RULER_VLLM_ENGINE_ARGS": '{"max_model_len": 8192}'}) == {
        "max_model_len": 8192, "structured_outputs_config": COMPACT_JSON}
    own = {"structured_outputs_config": {"backend": "guidance"}}
    assert engine_args({"RULER_VLLM_ENGINE_ARGS": json.dumps(own)}) == own
    for bad in ("[1]", "{not json"):
        with pytest.raises(ValueError, match="RULER_VLLM_ENGINE_ARGS"):
            engine_args({"RULER_VLLM_ENGINE_ARGS": bad})
    # what the setting means, in the grammar vLLM's xgrammar backend compiles from a judge's schema:
    # json.dumps' own layout accepted, newlines after '"scores": [' refused (so they cannot run on either)
    schema = json.dumps(response_schema(["1", "2"], max_explanation_chars=40))
    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=not COMPACT_JSON["disable_any_whitespace"])
    answer = json.dumps({"scores": [{"trajectory_id": i, "explanation": "fine", "score": 0.5} for i in "12"]})

    def accepts(text: str) -> bool:
        return _is_grammar_accept_string(grammar, text)

    assert accepts(answer)
    assert not accepts(answer.replace('"scores": [', '"scores": [' + "\n" * 50))  # the runaway, closed or not


def test_the_default_step_budget_never_fails_vllms_own_start_checks(tmp_path, monkeypatch):
    """The per-GPU default (here as on a GPU that takes 8192) is raised to max_num_seqs (vLLM refuses a step
    budget below it) and, with chunked prefill off, to the served context length (as vLLM raises its own
    default), so a default never fails vLLM's checks at start."""
    from ruler_rl.trainer import vllm_server

    monkeypatch.setattr(vllm_server, "_serving_gpu_batched_tokens", lambda config: 8192)

    def budget(**engine):
        argv = VLLMServer("some/model", EngineConfig(engine="vllm", **engine), served_name="m", lora_rank=8,
                          log_dir=tmp_path, chat_template_file=None, tool_parser="hermes", reasoning_parser=None,
                          port=8000).command()
        return int(argv[argv.index("--max-num-batched-tokens") + 1])

    assert budget() == 8192
    assert budget(max_num_seqs=10000) == 10000
    assert budget(max_seq_length=32768) == 8192  # chunked prefill on: prompts are prefilled in chunks
    assert budget(max_seq_length=32768, vllm_args={"no_enable_chunked_prefill": True}) == 32768
    assert budget(max_model_len=20000, vllm_args={"--no-enable-chunked-prefill": True}) == 20000
    argv = VLLMServer("some/model", EngineConfig(engine="vllm", vllm_args={"--no-enable-chunked-prefill": True}),
                      served_name="m", lora_rank=8, log_dir=tmp_path, chat_template_file=None, tool_parser="hermes",
                      reasoning_parser=None, port=8000).command()
    assert "--no-enable-chunked-prefill" in argv  # a key given with its dashes reaches vLLM as one flag
    assert budget(max_num_batched_tokens=4096) == 4096  # given: as it is


def test_a_child_server_finds_ruler_rl_as_this_process_does(tmp_path, monkeypatch):
    """The editable install needs nothing on the child's PYTHONPATH (and the checkout's root there would offer its
    folders as top-level names); a plain folder holding ruler_rl (a wheel's site-packages, the GPU host's link
    tree) is added, not the folder a link points into."""
    import subprocess

    import ruler_rl

    server = VLLMServer("some/model", EngineConfig(engine="vllm"), served_name="m", lora_rank=8, log_dir=tmp_path,
                        chat_template_file=None, tool_parser="hermes", reasoning_parser=None, port=8000)
    assert "PYTHONPATH" not in server.environment({"PATH": "/bin"})
    assert server.environment({"PYTHONPATH": "/x"})["PYTHONPATH"] == "/x"
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["bash", str(root / "evals/device/link_package.sh"), str(tmp_path / "links")], check=True)
    monkeypatch.setattr(ruler_rl, "__file__", str(tmp_path / "links/ruler_rl/__init__.py"))
    assert server.environment({"PYTHONPATH": "/x"})["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "links"), "/x"])
