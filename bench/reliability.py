"""Reliability report: bad inputs tried, faults injected, requests served, errors, artifacts lost
-> reports/reliability.json.

    python bench/reliability.py fuzz [--seconds 300]   # make fuzz: the mutation fuzzer against the ASan + UBSan
                                                       # build (build/native-asan) -> reports/fuzz_native.json
    python bench/reliability.py run                    # make reliability: bad-input + security tests (pytest,
                                                       # real servers), the fault scenarios of
                                                       # tests/reliability/scenarios.py, a bounded fuzz run, and
                                                       # the figures of reports/load.json and fuzz_native.json

Everything comes from a real run on this machine: pytest's junit XML for the input cases, the scenarios'
own observations for the faults.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
REPORTS = ROOT / "reports"
ASAN_PKG = ROOT / "build" / "native-asan" / "pkg"


def _gcc_lib(name: str) -> str:
    return subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()


def cmd_fuzz(args) -> int:
    so = next(ASAN_PKG.glob("nexus_native/_core*.so"), None)
    if so is None:
        print("no ASan build: run `make native-asan` first", file=sys.stderr)
        return 2
    symbols = subprocess.run(["nm", "-D", str(so)], capture_output=True, text=True).stdout
    instrumented = {"address": "__asan_report_load" in symbols, "undefined": "__ubsan_handle" in symbols}
    env = dict(os.environ, PYTHONPATH=f"{ASAN_PKG}{os.pathsep}{ROOT}",
               # libstdc++ preloaded with libasan: ASan must see __cxa_throw (the parsers throw on bad input)
               LD_PRELOAD=f"{_gcc_lib('libasan.so')} {_gcc_lib('libstdc++.so')}",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    out_json = Path(tempfile.mkdtemp()) / "fuzz.json"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz" / "fuzz_native.py"), "--seconds",
                        str(args.seconds), "--seed", str(args.seed), "--json", str(out_json)],
                       cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    stderr = p.stderr
    sanitizer_reports = stderr.count("ERROR: AddressSanitizer") + stderr.count("runtime error:")
    res = json.loads(out_json.read_text()) if out_json.exists() else {"execs": None}
    res.update({
        "what": "mutation fuzzing of AtbBlock.from_bytes / read_atb_header and AtbBlock.from_state / state_info",
        "build": "gcc -fsanitize=address,undefined -fno-sanitize-recover=undefined (build/native-asan)",
        "instrumented": instrumented, "module": str(so.relative_to(ROOT)),
        "exit_code": p.returncode, "wall_s": round(time.monotonic() - t0, 1),
        "crashes": 0 if p.returncode == 0 else 1, "sanitizer_reports": sanitizer_reports,
        "stderr_tail": stderr[-3000:] if p.returncode else "",
        "coverage_guidance": "outcome-guided (new parser error -> corpus); no native coverage (atheris needs a "
                             "clang -fsanitize=fuzzer-no-link build; gcc only here)",
    })
    out = Path(args.json)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res.get(k) for k in ("execs", "execs_per_s", "crashes", "sanitizer_reports",
                                               "instrumented", "exit_code")}, indent=2))
    return 0 if p.returncode == 0 and sanitizer_reports == 0 and all(instrumented.values()) else 1


def _pytest_cases(paths: list[str], junit: Path) -> tuple[list[dict], int]:
    p = subprocess.run([sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider",
                        f"--junitxml={junit}"], cwd=ROOT, capture_output=True, text=True)
    return _junit_cases(junit), p.returncode


def _junit_cases(junit: Path) -> list[dict]:
    cases = []
    for tc in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in tc:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        cases.append({"case": f"{tc.get('classname', '').rsplit('.', 1)[-1]}::{tc.get('name')}",
                      "outcome": outcome, "s": round(float(tc.get("time", 0)), 2)})
    return cases


START_TIMEOUT_S = 1200  # servers start slowly when the shared cores are busy (this runs at nice 19)


def start_compiler(store_url: str):
    from services.compiler.config import CompilerConfig
    from services.compiler.server import run
    from tests.conftest import ServerThread

    return ServerThread(run, CompilerConfig(port=0, store_url=store_url, grace_s=0.5, metrics_port=0)).start(
        START_TIMEOUT_S)


def start_engine(store_url: str):
    from services.engine.config import EngineConfig
    from services.engine.server import run
    from tests.conftest import ServerThread

    return ServerThread(run, EngineConfig(port=0, store_url=store_url, grace_s=0.5, metrics_port=0)).start(
        START_TIMEOUT_S)


def start_router(store_url: str, compiler_addr: str):
    from dataclasses import replace

    from services.router.config import RouterConfig
    from services.router.server import run
    from tests.conftest import ServerThread

    cfg = replace(RouterConfig(), port=0, store_url=store_url, compiler_addr=compiler_addr, grace_s=0.5,
                  metrics_port=0)
    return ServerThread(run, cfg).start(START_TIMEOUT_S)


def _faults(tmp: Path) -> list[dict]:
    from services.common.tools import load_registry_dir
    from tests.conftest import TOOLS_DIR
    from tests.reliability import scenarios
    from tests.reliability.conftest import RedisProcess

    def redis(name: str) -> RedisProcess:
        (tmp / name).mkdir()
        return RedisProcess(tmp / name).start()

    keep = ("get_current_time", "convert_time", "git_status", "git_log", "brave_web_search", "read_text_file")
    tools = [t for t in load_registry_dir(str(TOOLS_DIR)) if t.name in keep]
    out = []
    for name, fn in (
        ("redis_outage", lambda r: scenarios.redis_outage(r, tools, start_compiler, start_router, routes=50)),
        ("redis_sigkill", lambda r: scenarios.redis_kill9_durability(r, n_objects=200)),
        ("redis_multi_interrupted", scenarios.redis_multi_interrupted),
    ):
        r = redis(name)
        try:
            t0 = time.monotonic()
            res = fn(r)
            res["s"] = round(time.monotonic() - t0, 1)
            out.append({"scenario": name, **res})
        finally:
            r.stop()
    out.append({"scenario": "local_store_writer_killed", **scenarios.interrupted_local_writes(tmp / "local")})
    store = tmp / "engine-store"
    compiler = start_compiler(str(store))
    try:
        from nexus_client import NexusClient

        tool = next(t for t in tools if t.name == "get_current_time")
        with NexusClient(compiler=compiler.addr, timeout_s=300) as c:
            c.compile(tool.to_json())
    finally:
        compiler.stop()
    from services.common.store import LocalStore

    LocalStore(store).registry_put([tool])  # what RegisterTools does after compiling
    out.append({"scenario": "engine_restart", **scenarios.engine_restart(str(store), "get_current_time", start_engine)})
    return out


def _fault_ok(f: dict) -> bool:
    checks = {
        "redis_outage": lambda: f["route_errors_during_outage"] == 0 and f["compile_status_during_outage"] == "UNAVAILABLE"
        and f["compile_recovered"],
        "redis_sigkill": lambda: f["registry_version_kept"],
        "redis_multi_interrupted": lambda: f["registry_unchanged"],
        "local_store_writer_killed": lambda: not f["fresh_key_visible"],
        "engine_restart": lambda: f["generate_after_restart_ok"],
    }
    return bool(checks[f["scenario"]]()) and f.get("artifacts_lost", 0) == 0


def cmd_run(args) -> int:
    from tests.fuzz.fuzz_native import fuzz

    build = ROOT / "build" / "reliability"
    build.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print("bad-input and security tests (real servers) …", file=sys.stderr, flush=True)
    if args.reuse_junit and (build / "junit.xml").exists():
        cases, rc = _junit_cases(build / "junit.xml"), None
    else:
        cases, rc = _pytest_cases(["tests/reliability/test_bad_input.py", "tests/reliability/test_security.py"],
                                  build / "junit.xml")
    print("fault scenarios …", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="nexus-faults-") as tmp:
        faults = _faults(Path(tmp))
    print(f"bounded fuzz run ({args.fuzz_seconds:.0f} s, normal build) …", file=sys.stderr, flush=True)
    import nexus_native as nn

    quick_fuzz = fuzz(args.fuzz_seconds, seed=0, nn=nn)
    long_fuzz = json.loads((REPORTS / "fuzz_native.json").read_text()) if (REPORTS / "fuzz_native.json").exists() \
        else None
    load = json.loads((REPORTS / "load.json").read_text()) if (REPORTS / "load.json").exists() else None

    failed_cases = [c["case"] for c in cases if c["outcome"] == "failed"]
    failed_faults = [f["scenario"] for f in faults if not _fault_ok(f)]
    load_requests = sum(r["requests"] for r in load["rpcs"].values()) if load else 0
    load_errors = load["errors_total"] if load else 0
    fault_requests = sum(f.get("requests_served", 0) for f in faults)
    report = {
        "what": "Nexus reliability: bad input, fuzzing, faults, load (issue #8)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "inputs_tried": {"count": len(cases), "failed": failed_cases,
                         "cases": [c["case"] for c in cases]},
        "fuzz": {"bounded_normal_build": quick_fuzz,
                 "long_asan_ubsan": ({k: long_fuzz.get(k) for k in ("execs", "execs_per_s", "elapsed_s", "crashes",
                                                                      "sanitizer_reports", "instrumented", "build",
                                                                      "coverage_guidance", "targets")}
                                     if long_fuzz else "not run (make fuzz)")},
        "faults_injected": faults,
        "faults_failed": failed_faults,
        "load": ({"requests": load_requests, "errors": load_errors, "seconds": load["config"]["seconds"],
                  "rpcs": {k: {m: v[m] for m in ("requests", "throughput_rps", "p50_ms", "p99_ms", "errors")}
                           for k, v in load["rpcs"].items()},
                  "memory_flat": load["memory_flat"],
                  "rss_growth_mib": {s: g.get("growth_mib") for s, g in load["rss"].items()}}
                 if load else "not run (make load)"),
        "requests_served": len(cases) + fault_requests + load_requests,
        "fuzz_execs": quick_fuzz["execs"] + ((long_fuzz or {}).get("execs") or 0),
        "errors": len(failed_cases) + len(failed_faults) + load_errors + quick_fuzz["crashes"]
        + ((long_fuzz or {}).get("crashes") or 0) + ((long_fuzz or {}).get("sanitizer_reports") or 0),
        "artifacts_lost": sum(f.get("artifacts_lost", 0) for f in faults),
        "pytest_exit_code": rc,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("requests_served", "fuzz_execs", "errors", "artifacts_lost",
                                              "faults_failed")} | {"inputs_tried": len(cases)}, indent=2))
    return 0 if report["errors"] == 0 and report["artifacts_lost"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fuzz", help="long fuzz run against the ASan + UBSan build")
    f.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", 300)))
    f.add_argument("--seed", type=int, default=1)
    f.add_argument("--json", default=str(REPORTS / "fuzz_native.json"))
    f.set_defaults(fn=cmd_fuzz)
    r = sub.add_parser("run", help="bad inputs + faults + bounded fuzz -> reports/reliability.json")
    r.add_argument("--fuzz-seconds", type=float, default=20)
    r.add_argument("--reuse-junit", action="store_true", help="report the last pytest run instead of a new one")
    r.add_argument("--json", default=str(REPORTS / "reliability.json"))
    r.set_defaults(fn=cmd_run)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
