import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# One CPU thread for torch, here and in the processes tests start: the tests' models are tiny, and on a loaded
# 2-core machine two threads per op wait on each other (test_block_attention.py took 36 s with two, 14 s with one).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys

import pytest

from evals.art_e.inbox import ENRON_DIR
from ruler_rl.testing import FakeJudge

# Fixtures whose set-up alone takes seconds to minutes on a 2-core CPU (a model loaded or trained, a server
# process, a cluster): every test that uses one, directly or through another fixture, is marked `slow`, which
# the default run (pyproject's addopts: -m "not slow") skips and .ci/run runs.
HEAVY_FIXTURES = frozenset({
    "embedded_model",  # the real embedded SmolLM2 (loaded once per session)
    "tiny_trainable",  # a TrainableModel on a LocalBackend
    "one_varied_step",  # a training step of such a model
    "enron_db",  # all four Enron mailboxes built into one inbox (test_art_e_question_rules.py)
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own judge cache directory."""
    monkeypatch.setenv("RULER_CACHE_DIR", str(tmp_path / "judge-cache"))


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc `malloc_trim`): CPU torch frees large activations
    into malloc's arenas, which otherwise keep the test process's resident size at its high-water mark."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@pytest.fixture(autouse=True)
def _trim_after_each_test():
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:  # the embedded judge sets one per core when loaded
        torch.set_num_threads(1)
    _trim_heap()


@pytest.fixture(autouse=True, scope="module")
def _release_module_memory():
    """After each test file: the local folder models and the per-test judge caches it opened are let go (one
    process runs the whole suite; kept, they add up to gigabytes). What survives the collection (imported
    libraries, session fixtures) is then frozen (`gc.freeze`), so that later collections, this one after the
    next file and the interpreter's own, no longer walk its ~600,000 objects each time (about 0.3 s of CPU per
    file with torch, transformers and litellm imported)."""
    yield
    import gc

    from ruler_rl import cache
    from ruler_rl.judges import embedded

    embedded._folders.clear()
    with cache._open_lock:
        for opened in cache._open.values():
            opened.close()
        cache._open.clear()
    gc.collect()
    gc.freeze()
    _trim_heap()


@pytest.fixture(scope="session")
def _judge_server():
    judge = FakeJudge()
    yield judge
    judge.close()


@pytest.fixture
def judge(_judge_server):
    _judge_server.reset()
    yield _judge_server
    _judge_server.reset()


@pytest.fixture(scope="session")
def embedded_model():
    """The real embedded model, loaded once per test session."""
    from ruler_rl.judges.embedded import load_embedded_model

    return load_embedded_model()


@pytest.fixture(scope="session")
def inbox_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("inbox") / "inbox.db"
    from evals.art_e.inbox import build_inbox_db

    report = build_inbox_db([ENRON_DIR / "beck-s.tar.gz"], db)
    return db, report




@pytest.fixture
def tiny_dir(tmp_path):
    """A model folder of the scale benchmark's `tiny` shape: its config.json and SmolLM2's tokenizer, no weights."""
    from evals.scale_bench.shapes import make_model_dir

    return make_model_dir("tiny", tmp_path / "tiny")


@pytest.fixture
def tiny_trainable(tiny_dir, tmp_path):
    """(model, backend): a TrainableModel of the tiny shape with random weights on the transformers engine, LoRA
    r4, and the LocalBackend to register it with (the test registers it and closes the backend)."""
    from ruler_rl.trainer import EngineConfig, LocalBackend, LoRAConfig, ModelConfig, TrainableModel

    cfg = ModelConfig(lora=LoRAConfig(rank=4, alpha=8), engine=EngineConfig(engine="transformers", max_seq_length=256))
    return TrainableModel("tiny", "p", str(tiny_dir), cfg), LocalBackend(tmp_path / "runs", random_weights=True)


@pytest.fixture
def one_varied_step():
    """An async function: one training step of a registered model on one group of four of its own replies,
    rewarded 0, 1, 2, 3 (every one with an advantage); returns the step's row."""
    from ruler_rl import Trajectory, TrajectoryGroup
    from ruler_rl.trainer import TrainConfig

    async def step(model) -> dict:
        msgs = [{"role": "user", "content": "Say something."}]
        reply = await model.openai_client().chat.completions.create(model=model.name, messages=msgs, n=4,
                                                                    max_tokens=6, temperature=1.0)
        group = TrajectoryGroup([Trajectory(messages_and_choices=[*msgs, c], reward=float(i))
                                 for i, c in enumerate(reply.choices)])
        return await model.train([group], TrainConfig(learning_rate=1e-3))

    return step
