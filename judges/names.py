"""The litellm provider names that `judges` registers and the embedded judge's model string. Imports nothing, so
code that only names a judge (the command line's help, `ruler_rl.judges.choice`) does not import litellm."""

from ruler_rl.judges.embedded import EMBEDDED_MODEL_NAME

LOCAL_PROVIDER = "local"  # judges/local_provider.py
VLLM_ENGINE_PROVIDER = "vllm-engine"  # judges/vllm_engine.py
EMBEDDED_JUDGE = f"{LOCAL_PROVIDER}/{EMBEDDED_MODEL_NAME}"
