"""`RAY_ADDRESS` naming a cluster that is not there: registering fails within `placement_timeout_s` naming the
address, instead of waiting on Ray's own connection retries (minutes). Each case runs in a process of its own
(a Ray connection attempt that is given up on is left to end by itself)."""

import json
import os
import subprocess
import sys
import time

import pytest

SCRIPT = """
import json, os, socket, sys, threading, time
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); port = listener.getsockname()[1]
if sys.argv[1] == "silent":  # accepts connections, never answers
    listener.listen(16)
    threading.Thread(target=lambda: [listener.accept() for _ in iter(int, 1)], daemon=True).start()
else:  # nothing listens
    listener.close()
os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
import asyncio
from functools import partial
from ruler_rl.trainer import EngineConfig
from ruler_rl.trainer.ray_placement import RayServer
config = EngineConfig(engine="transformers", placement="dedicated", launcher="ray", placement_timeout_s=3)
server = RayServer(lambda host: None, config, served_name="m", log_dir=sys.argv[2])
started = time.monotonic()
try:
    asyncio.run(server.start())
    outcome = "started"
except Exception as exc:
    outcome = f"{type(exc).__name__}: {exc}"
print(json.dumps({"outcome": outcome, "seconds": time.monotonic() - started}), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("cluster", ["closed", pytest.param("silent", marks=pytest.mark.slow)])  # silent: waits out the timeout
def test_a_ray_address_that_does_not_answer_fails_within_the_placement_timeout(tmp_path, cluster):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SCRIPT, cluster, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if cluster == "closed":  # refused at once, before Ray is asked
        assert result["outcome"].startswith("RayConnectionError: nothing answers at RAY_ADDRESS='127.0.0.1:")
        assert result["seconds"] < 2
    else:
        assert result["outcome"].startswith("RayConnectionError: the Ray cluster at RAY_ADDRESS='127.0.0.1:")
        assert "did not answer within placement_timeout_s=3 s" in result["outcome"]
        assert 2.9 < result["seconds"] < 6
    assert time.monotonic() - started < 90
