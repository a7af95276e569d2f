"""`nexus up` as a user runs it: three services and the OpenAI front, the full 338-tool registry, then the README's
grpcurl lines and the banner's curl and `openai` client lines."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, TOOLS_DIR, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def nexus_up(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up")
    ports = {s: free_port() for s in ("router", "compiler", "engine", "openai")}
    mports = {s: free_port() for s in ("router", "compiler", "engine")}
    cmd = [sys.executable, "-m", "cli.main", "up", "--tools", str(TOOLS_DIR), "--store", str(tmp / "store"),
           "--log-dir", str(tmp / "log")] + [f"--{s}-port={p}" for s, p in ports.items()]
    # started with SIGINT ignored, as a background job of a non-interactive shell (CI) is: Ctrl-C must still work
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
                            env={**os.environ, "PYTHONUNBUFFERED": "1",
                                 **{f"NEXUS_{s.upper()}_METRICS_PORT": str(p) for s, p in mports.items()}})
    banner = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise AssertionError(f"nexus up exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
            continue
        banner.append(line)
        # up once the tools route and generate; the KV blocks compile in the background and it says when they are
        # done: the tests below want the spliced path, so they start then
        if line.startswith("every KV block compiled"):
            break
    else:
        proc.kill()
        raise AssertionError("nexus up did not come up (and compile its KV blocks) in time")
    ports["metrics"] = mports
    yield ports, "".join(banner), proc, tmp / "log"
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def test_banner_prints_grpcurl_lines(nexus_up):
    ports, banner, _, _ = nexus_up
    assert banner.index("Ctrl-C stops the cluster") < banner.index("every KV block compiled")  # up before the blocks
    assert f"nexus_kv_blocks_pending on http://127.0.0.1:{ports['metrics']['compiler']}/metrics" in banner
    assert f"127.0.0.1:{ports['router']} nexus.v1.RouterService/Route" in banner
    assert "nexus.v1.EngineService/Generate" in banner


def test_full_registry_routes_and_generates(nexus_up, grpcurl):
    ports, banner, _, _ = nexus_up
    # Run the exact Route line the banner prints.
    route_line = next(ln for ln in banner.splitlines() if "RouterService/Route" in ln).strip()
    args = json.loads(route_line.split("-d '", 1)[1].split("'", 1)[0])
    out = subprocess.run([grpcurl, "-plaintext", "-d", json.dumps(args), f"127.0.0.1:{ports['router']}",
                          "nexus.v1.RouterService/Route"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    route = json.loads(out.stdout)
    assert "pull_request" in route["tool"], route
    gen = subprocess.run([grpcurl, "-plaintext", "-d", json.dumps({"query": args["query"], "tool": route["tool"]}),
                          f"127.0.0.1:{ports['engine']}", "nexus.v1.EngineService/Generate"],
                         capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0, gen.stderr
    last = json.loads("{" + gen.stdout.rsplit("\n{", 1)[-1])
    json.loads(last["result"]["arguments_json"])
    assert last["result"]["schema_valid"]
    listed = subprocess.run([grpcurl, "-plaintext", f"127.0.0.1:{ports['router']}", "nexus.v1.RouterService/ListTools"],
                            capture_output=True, text=True, timeout=60)
    assert len(json.loads(listed.stdout)["tools"]) == 338


def test_prometheus_metrics_count_what_was_served(nexus_up):
    import urllib.request

    ports, _, _, _ = nexus_up
    def scrape(svc):
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics'][svc]}/metrics", timeout=10) as r:
            return r.read().decode()

    def value(text, name):
        line = next(ln for ln in text.splitlines() if ln.startswith(name + " ") or ln.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    router = scrape("router")
    assert value(router, "nexus_route_latency_ms_count") >= 1
    assert 'nexus_rpc_total{code="OK",method="RegisterTools",service="router"}' in router
    engine = scrape("engine")
    assert value(engine, "nexus_ttft_ms_count") >= 1
    assert value(engine, 'nexus_generate_path_total{path="splice"}') >= 1  # the compiler made the KV blocks
    compiler = scrape("compiler")
    assert value(compiler, 'nexus_compiles_total{cached="false"}') >= 300


def test_the_compiler_takes_the_hosts_cores_for_the_kv_blocks(nexus_up):
    """`nexus up` compiles the whole registry's KV blocks in the compiler's background: it decodes with the host's
    cores (up to 4; NEXUS_COMPILER_KV_THREADS overrides it)."""
    import os

    _, _, _, log_dir = nexus_up
    want = min(os.cpu_count() or 1, 4) if "NEXUS_COMPILER_KV_THREADS" not in os.environ else int(
        os.environ["NEXUS_COMPILER_KV_THREADS"])
    lines = [json.loads(ln) for ln in (log_dir / "compiler.log").read_text().splitlines() if ln.startswith("{")]
    assert [ln["threads"] for ln in lines if ln.get("msg") == "KV blocks"] == [want]


def test_the_banners_openai_lines_call_a_tool_through_the_front(nexus_up):
    """`nexus up` starts the OpenAI-compatible front after the router and the engine: the banner's curl line and its
    `openai` client line, run as printed, each answer a tool call (their tool joins the registry: after the tests that
    count it)."""
    ports, banner, _, _ = nexus_up
    curl = next(ln for ln in banner.splitlines() if ln.strip().startswith("curl ")).strip()
    assert f"http://127.0.0.1:{ports['openai']}/v1/chat/completions" in curl
    out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120)
    body = json.loads(out.stdout)
    assert body["choices"][0]["finish_reason"] == "tool_calls", body
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    py = next(ln for ln in banner.splitlines() if ln.strip().startswith("python -c ")).strip()
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-c", py], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and "get_weather" in out.stdout, out.stderr[-2000:]


def readme_grpcurl_lines() -> list[str]:
    """Every grpcurl command in README.md's bash blocks, continuation lines joined."""
    text = (REPO / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```bash\n")[1:]]
    out = []
    for block in blocks:
        for cmd in block.replace("\\\n", " ").splitlines():
            if cmd.strip().startswith("grpcurl "):
                out.append(cmd.strip())
    return out


def test_every_grpcurl_line_of_the_readme_runs(nexus_up, grpcurl):
    """The README's grpcurl lines, verbatim but for the ports: each one succeeds against the running cluster (the
    RegisterTools line registers a new tool, so this runs after the tests that count the registry)."""
    import shlex

    ports, _, _, _ = nexus_up
    lines = readme_grpcurl_lines()
    assert len(lines) >= 5 and any("RegisterTools" in ln for ln in lines)
    for line in lines:
        line = line.replace("127.0.0.1:50051", f"127.0.0.1:{ports['router']}").replace(
            "127.0.0.1:50053", f"127.0.0.1:{ports['engine']}")
        argv = shlex.split(line)
        out = subprocess.run([grpcurl, *argv[1:]], capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, (line, out.stderr[-2000:])


def test_sigint_stops_every_service(nexus_up):
    """Runs last: Ctrl-C stops the cluster gracefully and frees every port."""
    import socket

    ports, _, proc, _ = nexus_up
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    for port in (ports["router"], ports["compiler"], ports["engine"], ports["openai"]):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open"
