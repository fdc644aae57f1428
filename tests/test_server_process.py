"""A child inference server that dies while starting: the error names the cause even when the log's end does not."""

import sys

import pytest

from ruler_rl.trainer.config import EngineConfig
from ruler_rl.trainer.vllm_server import ServerProcess

SCRIPT = r"""
print("(EngineCore pid=12) INFO loading weights")
print("(EngineCore pid=12) ValueError: Free memory on device (3.1/139.8 GiB) on startup is less than desired")
for i in range(400):
    print(f"(EngineCore pid=12)   File 'frame_{i}.py', line {i}, in f")
print("(APIServer pid=11) RuntimeError: Engine core initialization failed. See root cause above.")
raise SystemExit(1)
"""


class Dying(ServerProcess):
    name = "dying"

    def command(self):
        return [sys.executable, "-c", SCRIPT]

    def _require(self):
        return None


async def test_a_failed_start_reports_the_first_error_lines_not_only_the_tail(tmp_path):
    server = Dying(EngineConfig(engine="transformers"), served_name="m", log_dir=tmp_path)
    with pytest.raises(RuntimeError) as info:
        await server.start()
    message = str(info.value)
    assert "exited with code 1 while starting" in message
    head, _, tail = message.partition("the end of")
    assert "ValueError: Free memory on device (3.1/139.8 GiB)" in head  # the cause, from early in the log
    assert "Free memory" not in tail  # ... which the last 3000 characters no longer hold
    assert "RuntimeError: Engine core initialization failed" in head
    assert "pid=12" not in head  # the process prefix is dropped
