"""README.md's "Use it from an agent framework" section: its Python, verbatim but for the port, against a running
front over the cluster fixture (the same pattern as tests/e2e's run of the README's grpcurl lines)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services.openai.config import OpenAIConfig
from tests.conftest import REPO, ServerThread

pytestmark = pytest.mark.integration

SECTION = "## Use it from an agent framework"


def readme_python_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    assert SECTION in text
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]


def test_the_section_has_one_python_snippet_naming_the_default_base_url():
    (snippet,) = readme_python_blocks()
    assert 'base_url="http://127.0.0.1:8000/v1"' in snippet and "from openai import OpenAI" in snippet


def test_the_readme_snippet_calls_a_tool_through_a_running_front(cluster):
    from services.openai.server import run

    before = {t.name for t in cluster["client"].list_tools().tools}
    front = ServerThread(run, OpenAIConfig(port=0, router_addr=cluster["router"].addr,
                                           engine_addr=cluster["engine"].addr, grace_s=0.5,
                                           backend_wait_s=60)).start()
    try:
        (snippet,) = readme_python_blocks()
        code = snippet.replace("http://127.0.0.1:8000/v1", f"http://{front.addr}/v1")
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        name, _, arguments = out.stdout.strip().partition(" ")
        assert name == "get_weather" and "paris" in json.loads(arguments)["city"].lower(), out.stdout
    finally:
        front.stop()
        added = [t.name for t in cluster["client"].list_tools().tools if t.name not in before]
        if added:  # leave the shared registry as found
            cluster["client"].remove(added)
