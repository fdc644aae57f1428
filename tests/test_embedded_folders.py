"""Folder models (`local/<folder>`, e.g. distilled judges) stay loaded for reuse, but only the most recent few:
a process that measures many judges one after another does not keep every model it ever loaded."""

import contextlib
import json

from ruler_rl.judges import embedded


class Stub:
    def __init__(self, path):
        self.path = path


def test_only_the_most_recently_used_folder_models_stay_loaded(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "EmbeddedModel", Stub)
    monkeypatch.setattr(embedded, "_folders", {})
    names = []
    for i in range(3):
        folder = tmp_path / f"judge{i}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", "i": i}))
        names.append(str(folder))
    a = embedded.load_local_model(names[0])
    b = embedded.load_local_model(names[1])
    assert embedded.load_local_model(names[0]) is a  # reused, and now the most recent
    embedded.load_local_model(names[2])  # one more than MAX_FOLDER_MODELS: the least recent (judge1) goes
    assert embedded.MAX_FOLDER_MODELS == 2 and len(embedded._folders) == 2
    assert embedded.load_local_model(names[0]) is a
    assert embedded.load_local_model(names[1]) is not b  # loaded again


# --- a folder from someone else: its chat template and its base model ---------------------------------------

import threading  # noqa: E402
import time  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

import pytest  # noqa: E402

from ruler_rl.judges.errors import JudgeConfigError  # noqa: E402

SPIN = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"  # CPU, no output
GROW = "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 4096 }}{% endfor %}{% endfor %}"


def folder_with_template(tmp_path, template: str):
    """The embedded model's files in a folder of their own (weights linked), its chat template replaced."""
    src = embedded.embedded_model_path()
    folder = tmp_path / "judge"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        (folder / name).symlink_to(src / name)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


@pytest.mark.parametrize("template,bound", [(SPIN, "did not finish within 1 s"),
                                            pytest.param(GROW, "grew this process's memory by more than 200 MiB",
                                                         marks=pytest.mark.slow)])
def test_a_chat_template_that_loops_is_stopped_at_its_bound_and_the_model_refused_after(tmp_path, monkeypatch,
                                                                                        template, bound):
    import time

    monkeypatch.setattr(embedded, "TEMPLATE_SECONDS", 1.0 if template == SPIN else 60.0)
    monkeypatch.setattr(embedded, "TEMPLATE_MAX_GROWTH", 200 * 2**20)
    model = embedded.EmbeddedModel(folder_with_template(tmp_path, template))
    before, started = rss(), time.monotonic()
    with pytest.raises(JudgeConfigError, match=f"chat template of the local model .* {bound} and was stopped"):
        model.generate([{"role": "user", "content": "hi"}], max_new_tokens=2)
    assert time.monotonic() - started < (5 if template == SPIN else 30)
    assert rss() - before < 600 * 2**20  # stopped near its bound, what it built let go
    assert not [t for t in threading.enumerate() if t.name.startswith("bounded:")]  # the render itself stopped
    if template == SPIN:  # a loop is refused from then on, at once
        started = time.monotonic()
        with pytest.raises(JudgeConfigError, match="this model is not used"):
            model.generate([{"role": "user", "content": "hi"}], max_new_tokens=2)
        assert time.monotonic() - started < 0.5


def test_a_good_template_renders_as_transformers_renders_it(tmp_path):
    folder = folder_with_template(tmp_path, json.loads(
        (embedded.embedded_model_path() / "tokenizer_config.json").read_text()).get("chat_template")
        or (embedded.embedded_model_path() / "chat_template.jinja").read_text())
    model = embedded.EmbeddedModel(folder)
    messages = [{"role": "system", "content": "Judge."}, {"role": "user", "content": "hi"}]
    expected = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                   return_dict=True)
    assert model._render(messages)["input_ids"].tolist() == expected["input_ids"].tolist()


class Recorder(BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        Recorder.paths.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


def test_a_base_model_on_the_hub_is_never_downloaded_unless_allowed(tmp_path, monkeypatch):
    """An adapter folder naming a hub id as its base: loading asks no server (a recording stand-in for the hub
    here) and says how to allow it; allowed, the hub is asked."""
    import huggingface_hub.constants

    hub = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{hub.server_address[1]}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "some-org/some-model",
                                                            "peft_type": "LORA"}))
    Recorder.paths = []
    try:
        monkeypatch.delenv(embedded.HUB_ENV, raising=False)
        with pytest.raises(JudgeConfigError, match=r"base model 'some-org/some-model' is not a folder and not in the "
                                                   r"Hugging Face cache, and local judges do not download .*"
                                                   r"RULER_LOCAL_MODELS_FROM_HUB=1"):
            embedded.EmbeddedModel(folder)
        assert Recorder.paths == []
        monkeypatch.setenv(embedded.HUB_ENV, "1")  # allowed: the hub is asked (its retries left to a thread)

        def ask_the_hub():  # no hub is reachable here: how it fails does not matter, only that it was asked
            with contextlib.suppress(Exception):
                embedded.EmbeddedModel(folder)

        threading.Thread(target=ask_the_hub, daemon=True).start()
        deadline = time.monotonic() + 60
        while not any("some-org/some-model" in p for p in Recorder.paths) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any("some-org/some-model" in p for p in Recorder.paths), Recorder.paths
    finally:
        hub.shutdown()
