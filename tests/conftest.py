import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest

from evals.art_e.inbox import ENRON_DIR
from ruler.testing import FakeJudge


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
    _trim_heap()


@pytest.fixture(autouse=True, scope="module")
def _release_module_memory():
    """After each test file: the local folder models and the per-test judge caches it opened are let go (one
    process runs the whole suite; kept, they add up to gigabytes)."""
    yield
    import gc

    from judges import embedded
    from ruler import cache

    embedded._folders.clear()
    with cache._open_lock:
        for opened in cache._open.values():
            opened.close()
        cache._open.clear()
    gc.collect()
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
    from judges.embedded import load_embedded_model

    return load_embedded_model()


@pytest.fixture(scope="session")
def inbox_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("inbox") / "inbox.db"
    from evals.art_e.inbox import build_inbox_db

    report = build_inbox_db([ENRON_DIR / "beck-s.tar.gz"], db)
    return db, report


