"""Folder models (`local/<folder>`, e.g. distilled judges) stay loaded for reuse, but only the most recent few:
a process that measures many judges one after another does not keep every model it ever loaded."""

import json

from judges import embedded


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
