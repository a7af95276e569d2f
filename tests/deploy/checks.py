"""Static checks of deploy/: a Dockerfile parser + linter, compose interpolation, and a Kubernetes
reference checker. Each returns a list of problems (empty = fine), so the tests can also show that a
broken input is caught."""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SERVICES = ("router", "compiler", "engine", "openai")
DEFAULT_PORTS = {"router": 50051, "compiler": 50052, "engine": 50053, "openai": 8000}
CONFIG_CLASSES = {"router": "RouterConfig", "compiler": "CompilerConfig", "engine": "EngineConfig",
                  "openai": "OpenAIConfig"}

# ---------------------------------------------------------------------------------------------------
# Service config: every NEXUS_<SVC>_* key we ship must be accepted by the service's own loader.


def config_problems(env: Mapping[str, str], where: str) -> list[str]:
    """Load each service's config from ``env`` with the real loader (unknown keys / bad types fatal)."""
    from services.common.config import load_config
    from services.common.errors import NexusError

    problems = []
    for svc in SERVICES:
        prefix = f"NEXUS_{svc.upper()}_"
        if not any(k.startswith(prefix) for k in env):
            continue
        mod = __import__(f"services.{svc}.config", fromlist=["x"])
        cls = getattr(mod, CONFIG_CLASSES[svc])
        try:
            load_config(cls, prefix=prefix, env={k: str(v) for k, v in env.items()})
        except NexusError as e:
            problems.append(f"{where}: {e.message}")
    return problems


# ---------------------------------------------------------------------------------------------------
# Dockerfiles


@dataclass(frozen=True)
class Instruction:
    cmd: str  # upper-case keyword
    args: str  # the rest, continuation lines joined
    line: int  # 1-based line of the keyword


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of a Dockerfile: comments dropped (also inside continuations), ``\\`` joined."""
    out: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for no, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not buf:
            start = no
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        joined = " ".join(buf)
        buf = []
        cmd, _, args = joined.partition(" ")
        out.append(Instruction(cmd.upper(), args.strip(), start))
    if buf:
        raise ValueError("Dockerfile ends inside a line continuation")
    return out


@dataclass(frozen=True)
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction]


def stages(instructions: list[Instruction]) -> list[Stage]:
    result: list[Stage] = []
    for ins in instructions:
        if ins.cmd == "FROM":
            parts = [p for p in ins.args.split() if not p.startswith("--")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            result.append(Stage(parts[0], name, []))
        elif result:
            result[-1].instructions.append(ins)
    return result


EXACT_TAG = re.compile(r"^[\w./-]+:(?=[^:]*\d+\.\d+\.\d+)[\w.-]+(@sha256:[0-9a-f]{64})?$|^[\w./-]+@sha256:[0-9a-f]{64}$")


def image_problems(image: str) -> list[str]:
    """An image reference must be pinned: an exact version tag (x.y.z…) or a digest; never latest."""
    if "$" in image:
        return [f"image {image!r} comes from a variable: it cannot be checked as pinned"]
    if re.search(r":latest(\b|$)", image) or ":" not in image.split("/")[-1] and "@" not in image:
        return [f"image {image!r} is not pinned (no tag or `latest`)"]
    if not EXACT_TAG.match(image):
        return [f"image {image!r}: tag is not an exact version (x.y.z) or digest"]
    return []


def _exec_form(args: str) -> list[str] | None:
    import json

    if args.startswith("["):
        try:
            return json.loads(args)
        except ValueError:
            return None
    return None


def _pip_requirements(run: str) -> Iterable[str]:
    """Requirement arguments of each ``pip install`` in a RUN line (options and paths skipped)."""
    for segment in re.split(r"&&|;|\|\|", run):
        try:
            words = shlex.split(segment)
        except ValueError:
            continue
        for i in range(len(words) - 1):
            if words[i] == "pip" and words[i + 1] == "install" or words[i].endswith("/pip") and words[i + 1] == "install":
                it = iter(words[i + 2 :])
                for w in it:
                    if w in ("-r", "--requirement", "-c", "--constraint", "--index-url", "--extra-index-url",
                             "-i", "--config-settings", "-w", "--wheel-dir"):
                        next(it, None)
                    elif w.startswith("-") or w.startswith(".") or w.startswith("/"):
                        continue
                    else:
                        yield w
                break


def lint_dockerfile(text: str, *, compose_healthcheck: bool = False) -> list[str]:
    """The rules we hold our Dockerfiles to (see deploy/README.md)."""
    problems: list[str] = []
    ins = parse_dockerfile(text)
    st = stages(ins)
    if len(st) < 2:
        problems.append("not multi-stage (fewer than two FROM)")
    names = {s.name for s in st if s.name}
    for s in st:
        if s.image not in names:
            problems += image_problems(s.image)
    for i in ins:
        if i.cmd == "ADD" and re.search(r"\bhttps?://", i.args):
            problems.append(f"line {i.line}: ADD from a URL (use a pinned, checksummed download in RUN)")
        if i.cmd in ("COPY", "ADD"):
            m = re.search(r"--from=(\S+)", i.args)
            if m and m.group(1) not in names:
                problems += image_problems(m.group(1))
        if i.cmd == "RUN":
            for req in _pip_requirements(i.args):
                if "==" not in req:
                    problems.append(f"line {i.line}: pip requirement {req!r} is not pinned with ==")
            if "apt-get install" in i.args:
                if "--no-install-recommends" not in i.args:
                    problems.append(f"line {i.line}: apt-get install without --no-install-recommends")
                if "rm -rf /var/lib/apt/lists" not in i.args:
                    problems.append(f"line {i.line}: apt lists not removed in the same layer")
    if not st:
        return problems + ["no FROM"]
    final = st[-1].instructions
    users = [(n, i) for n, i in enumerate(final) if i.cmd == "USER"]
    starts = [(n, i) for n, i in enumerate(final) if i.cmd in ("CMD", "ENTRYPOINT")]
    if not starts:
        problems.append("final stage has no CMD/ENTRYPOINT")
    if not users:
        problems.append("final stage has no USER (runs as root)")
    else:
        n_user, last_user = users[-1]
        who = last_user.args.split(":")[0]
        if who in ("root", "0"):
            problems.append(f"line {last_user.line}: USER {last_user.args} is root")
        if starts and n_user > starts[0][0]:
            problems.append(f"line {last_user.line}: USER comes after CMD/ENTRYPOINT")
    if not compose_healthcheck and not any(i.cmd == "HEALTHCHECK" for i in final):
        problems.append("final stage has no HEALTHCHECK (and none is declared in compose)")
    return problems


def dockerignore_patterns(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def is_ignored(rel: str, patterns: list[str]) -> bool:
    rel = rel.strip("/")
    parts = rel.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    for pat in patterns:
        pat = pat.strip("/")
        p2 = pat[3:] if pat.startswith("**/") else None
        for pre in prefixes:
            if fnmatch.fnmatch(pre, pat) or (p2 and fnmatch.fnmatch(pre.split("/")[-1], p2)):
                return True
    return False


# ---------------------------------------------------------------------------------------------------
# docker-compose

_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose-style ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` substitution, recursively."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3)
        val = env.get(name)
        if op in (":-", "-"):
            return val if (val if op == ":-" else val is not None) else arg
        if op in (":?", "?"):
            if not val if op == ":?" else val is None:
                raise KeyError(f"{name}: {arg}")
            return val
        return val or ""

    return _VAR.sub(sub, value.replace("$$", "\0")).replace("\0", "$")


def env_dict(environment: Any) -> dict[str, str]:
    if isinstance(environment, dict):
        return {k: "" if v is None else str(v) for k, v in environment.items()}
    out = {}
    for item in environment or []:
        k, _, v = str(item).partition("=")
        out[k] = v
    return out


# ---------------------------------------------------------------------------------------------------
# Kubernetes


def _key(doc: dict) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def pod_spec(doc: dict) -> dict | None:
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def check_k8s(docs: list[dict]) -> list[str]:
    """Cross-object references that a schema cannot see."""
    problems: list[str] = []
    index = {_key(d): d for d in docs}
    if len(index) != len(docs):
        problems.append("duplicate kind/name")
    workloads = [d for d in docs if pod_spec(d) is not None]
    configmaps = {n: d.get("data", {}) for (k, n), d in index.items() if k == "ConfigMap"}
    secrets = {n: {**d.get("data", {}), **d.get("stringData", {})} for (k, n), d in index.items() if k == "Secret"}
    namespaces = {n for (k, n) in index if k == "Namespace"}
    claims = {n for (k, n) in index if k == "PersistentVolumeClaim"}

    for d in docs:
        ns = d["metadata"].get("namespace")
        if d["kind"] != "Namespace" and ns is not None and namespaces and ns not in namespaces:
            problems.append(f"{_key(d)}: namespace {ns!r} is not defined")

    for w in workloads:
        name = _key(w)
        sel = w["spec"]["selector"].get("matchLabels", {})
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            problems.append(f"{name}: selector {sel} does not match the pod labels {labels}")
        spec = pod_spec(w)
        volumes = {v["name"] for v in spec.get("volumes", [])}
        volumes |= {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for v in spec.get("volumes", []):
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                problems.append(f"{name}: volume {v['name']} uses missing ConfigMap {v['configMap']['name']}")
            if "secret" in v and v["secret"]["secretName"] not in secrets:
                problems.append(f"{name}: volume {v['name']} uses missing Secret {v['secret']['secretName']}")
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in claims:
                problems.append(f"{name}: volume {v['name']} uses missing PersistentVolumeClaim "
                                f"{v['persistentVolumeClaim']['claimName']}")
        if w["kind"] == "StatefulSet":
            svc = index.get(("Service", w["spec"].get("serviceName", "")))
            if svc is None:
                problems.append(f"{name}: serviceName {w['spec'].get('serviceName')!r} is not a Service")
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            where = f"{name} container {c['name']}"
            ports = {p["containerPort"] for p in c.get("ports", [])}
            port_names = {p.get("name") for p in c.get("ports", [])}
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    problems.append(f"{where}: volumeMount {m['name']!r} has no volume")
            for src in c.get("envFrom", []):
                if "configMapRef" in src and src["configMapRef"]["name"] not in configmaps:
                    problems.append(f"{where}: envFrom missing ConfigMap {src['configMapRef']['name']}")
                if "secretRef" in src and src["secretRef"]["name"] not in secrets:
                    problems.append(f"{where}: envFrom missing Secret {src['secretRef']['name']}")
            defined: set[str] = set()
            for e in c.get("env", []):
                vf = e.get("valueFrom", {})
                for kind, table in (("configMapKeyRef", configmaps), ("secretKeyRef", secrets)):
                    if kind in vf:
                        ref = vf[kind]
                        if ref["name"] not in table:
                            problems.append(f"{where}: env {e['name']} uses missing {kind} {ref['name']}")
                        elif ref["key"] not in table[ref["name"]]:
                            problems.append(f"{where}: env {e['name']}: key {ref['key']!r} not in {ref['name']}")
                for var in re.findall(r"\$\((\w+)\)", str(e.get("value", ""))):
                    if var not in defined:
                        problems.append(f"{where}: env {e['name']} uses $({var}) before it is defined")
                defined.add(e["name"])
            for var in re.findall(r"\$\((\w+)\)", " ".join(map(str, c.get("args", []) + c.get("command", [])))):
                if var not in defined:
                    problems.append(f"{where}: args use $({var}), not defined in env")
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(probe_name)
                if not probe:
                    continue
                for kind in ("grpc", "tcpSocket", "httpGet"):
                    if kind in probe:
                        port = probe[kind]["port"]
                        if port not in ports and port not in port_names:
                            problems.append(f"{where}: {probe_name} port {port} is not a container port")
            img = c.get("image", "")
            if ":" not in img.split("/")[-1] or img.endswith(":latest"):
                problems.append(f"{where}: image {img!r} is not pinned to a tag")

    for (kind, n), d in index.items():
        if kind == "Service":
            sel = d["spec"].get("selector", {})
            targets = [w for w in workloads
                       if sel and all(w["spec"]["template"]["metadata"].get("labels", {}).get(k) == v
                                      for k, v in sel.items())]
            if not targets:
                problems.append(f"Service {n}: selector {sel} matches no workload")
            for p in d["spec"].get("ports", []):
                tp = p.get("targetPort", p["port"])
                ok = any(tp == cp.get("containerPort") or tp == cp.get("name")
                         for w in targets for c in pod_spec(w)["containers"] for cp in c.get("ports", []))
                if targets and not ok:
                    problems.append(f"Service {n}: targetPort {tp} is not a port of {[_key(t) for t in targets]}")
        if kind == "HorizontalPodAutoscaler":
            ref = d["spec"]["scaleTargetRef"]
            target = index.get((ref["kind"], ref["name"]))
            if target is None or target["apiVersion"] != ref.get("apiVersion", target["apiVersion"]):
                problems.append(f"HPA {n}: scaleTargetRef {ref} does not exist")
            elif d["spec"].get("minReplicas", 1) > d["spec"]["maxReplicas"]:
                problems.append(f"HPA {n}: minReplicas > maxReplicas")
            else:
                for m in d["spec"].get("metrics", []):
                    if m.get("type") == "Resource":
                        res = m["resource"]["name"]
                        for c in pod_spec(target)["containers"]:
                            if res not in c.get("resources", {}).get("requests", {}):
                                problems.append(f"HPA {n}: container {c['name']} has no {res} request")
        if kind == "PodDisruptionBudget":
            sel = d["spec"]["selector"]["matchLabels"]
            if not any(all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())
                       for w in workloads):
                problems.append(f"PDB {n}: selector {sel} matches no workload")
    return problems
