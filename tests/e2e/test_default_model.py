"""The shipped default model end to end (the other tests pin SmolLM2-135M for speed): `nexus up` with no model
configured, on a handful of tools, routes and calls one through the OpenAI front with the official client."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from services.common.models import ENGINE_MODEL, file_fingerprint, resolve_gguf
from tests.conftest import REPO, TOOLS_DIR, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def default_up(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("default-up")
    tools = tmp / "tools"
    tools.mkdir()
    for server in ("time", "fetch"):
        (tools / f"{server}.json").write_text((TOOLS_DIR / f"{server}.json").read_text())
    ports = {s: free_port() for s in ("router", "compiler", "engine", "openai")}
    env = {k: v for k, v in os.environ.items() if k != "NEXUS_DEFAULT_MODEL"}
    env.update({"PYTHONUNBUFFERED": "1", **{f"NEXUS_{s.upper()}_METRICS_PORT": str(free_port())
                                           for s in ("router", "compiler", "engine")}})
    cmd = [sys.executable, "-m", "cli.main", "up", "--tools", str(tools), "--store", str(tmp / "store"),
           "--log-dir", str(tmp / "log")] + [f"--{s}-port={p}" for s, p in ports.items()]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"nexus up exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
        if "Ctrl-C stops the cluster" in line:
            break
    else:
        proc.kill()
        raise AssertionError("nexus up did not come up in time")
    yield ports, tmp / "log"
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)


def test_the_engine_and_compiler_run_the_measured_default(default_up):
    _, log_dir = default_up
    path = resolve_gguf(ENGINE_MODEL)

    def logged(service: str, msg: str) -> dict:
        lines = [json.loads(ln) for ln in (log_dir / f"{service}.log").read_text().splitlines() if ln.startswith("{")]
        return next(ln for ln in lines if ln.get("msg") == msg)

    engine = logged("engine", "model")
    assert engine["path"] == str(path) and engine["model"] == file_fingerprint(path) and engine["family"] == "qwen2"
    assert logged("compiler", "KV blocks")["model"] == str(path)


def test_the_default_model_calls_a_tool_through_the_front(default_up):
    from openai import OpenAI

    ports, _ = default_up
    time_tools = json.loads((TOOLS_DIR / "time.json").read_text())["tools"]
    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                "parameters": t["inputSchema"]}} for t in time_tools]
    client = OpenAI(base_url=f"http://127.0.0.1:{ports['openai']}/v1", api_key="-")
    out = client.chat.completions.create(model=client.models.list().data[0].id, tools=tools, messages=[
        {"role": "user", "content": "What time is it in Asia/Tokyo right now?"}])
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0].function
    assert call.name == "get_current_time"
    assert json.loads(call.arguments) == {"timezone": "Asia/Tokyo"}
