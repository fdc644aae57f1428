"""Shared test data: the email-agent conversation most tests judge, and a tiny trainable model."""

from __future__ import annotations

SYSTEM = {"role": "system", "content": "You are an email agent. Answer the user's question from their inbox."}
USER = {"role": "user", "content": "When is the budget meeting?"}


def convo(answer: str, *extra: dict) -> list[dict]:
    """The system and user messages, any `extra` messages, then the assistant's `answer`."""
    return [SYSTEM, USER, *extra, {"role": "assistant", "content": answer}]


def tiny_lora_model(seed: int = 0):
    """A tiny random fp32 Llama (vocabulary 97, 2 layers) with a LoRA adapter whose B matrices are non-zero,
    so the adapter changes the output and every LoRA parameter gets a gradient."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, attn_implementation="sdpa")
    base = LlamaForCausalLM(cfg).float()
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in peft.named_parameters():  # LoRA B starts at zero: make the adapter matter
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    return peft


def budget_review_scenario(db_path):
    """An ART·E question about sally.beck's inbox whose answer is the sender of the first "budget review" hit."""
    from evals.art_e.questions import Scenario
    from evals.art_e.tools import InboxTools

    sally = "sally.beck@enron.com"
    tools = InboxTools(db_path, sally, "2001-12-31")
    hit = tools.search_emails(["budget", "review"])[0]["message_id"]
    email = tools.read_email(hit)
    return Scenario(id="s1", question="Who sent the budget review?", answer=email["from_address"], message_ids=[hit],
                    inbox_address=sally, query_date="2001-12-31", how_realistic=0.5, split="test")
