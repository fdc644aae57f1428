"""The CPU engine samples exactly the distribution whose logprobs it reports: the model's own
`generation_config.json` (repetition penalty, n-gram bans, suppressed tokens, minimum length, default top-k)
takes no part, as vLLM's `--generation-config vllm` ignores it. The real tiny model, its real tokenizer."""

import asyncio

import pytest

from ruler_rl.judges.embedded import embedded_model_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine_with_hostile_defaults():
    """SmolLM2-135M under peft, its generation config set as a model card might ship it, but harder: each of these
    reshapes the distribution the tokens are drawn from."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ruler_rl.trainer.engine_transformers import TransformersEngine
    from ruler_rl.trainer.sequences import end_of_turn_ids

    path = embedded_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    gen = hf.generation_config
    gen.repetition_penalty, gen.no_repeat_ngram_size, gen.top_k, gen.top_p = 1.5, 1, 3, 0.5
    gen.min_new_tokens, gen.temperature = 40, 0.3
    model = get_peft_model(hf, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    ends = end_of_turn_ids(tokenizer, gen)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Count: one two one two one two"}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
    return TransformersEngine(model, tokenizer, stop_token_ids=ends), prompt, hf


def test_greedy_tokens_are_the_argmax_of_the_reported_distribution(engine_with_hostile_defaults):
    engine, prompt, hf = engine_with_hostile_defaults
    (sample,) = asyncio.run(engine.generate(prompt, max_tokens=48, temperature=0, top_logprobs=1))
    assert len(sample.token_ids) >= 8
    # with the repetition penalty or the n-gram ban at work, greedy would leave the reported argmax
    for i, (token, tops) in enumerate(zip(sample.token_ids, sample.top_logprobs)):
        assert tops[0][0] == token, f"token {i} is {token}, the reported distribution's argmax is {tops[0][0]}"
    assert hf.generation_config.repetition_penalty == 1.5  # the model's own config is left as it was


def test_sampling_at_temperature_one_draws_from_the_reported_logprobs(engine_with_hostile_defaults):
    engine, prompt, _ = engine_with_hostile_defaults
    samples = asyncio.run(engine.generate(prompt, n=4, max_tokens=48, temperature=1.0, seed=3))
    tokens = [t for s in samples for t in s.token_ids]
    # no_repeat_ngram_size=1 would forbid any token twice in a sample; the policy itself repeats tokens
    assert any(len(set(s.token_ids)) < len(s.token_ids) for s in samples)
    # top_k=3 / top_p=0.5 would keep every sampled token among the likeliest few (logprob near 0)
    assert min(lp for s in samples for lp in s.logprobs) < -3.0, tokens
