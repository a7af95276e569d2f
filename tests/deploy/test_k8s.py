"""deploy/k8s: schema-valid manifests (kubernetes-validate) whose cross references hold."""

from __future__ import annotations

import copy
import shutil
import subprocess

import pytest
import yaml

from tests.deploy.checks import DEFAULT_PORTS, DEPLOY, check_k8s, config_problems, pod_spec

K8S = DEPLOY / "k8s"


def load_docs() -> list[dict]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for f in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / f).read_text()) if d]
    return docs


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return load_docs()


def get(docs, kind, name):
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == on_disk


def test_references_hold(docs):
    assert check_k8s(docs) == []


def test_the_reference_checker_catches_broken_references(docs):
    def broken(mutate) -> list[str]:
        d = copy.deepcopy(docs)
        mutate(d)
        return check_k8s(d)

    assert any("matches no workload" in p for p in broken(
        lambda d: get(d, "Service", "compiler")["spec"]["selector"].update({"app.kubernetes.io/name": "compilr"})))
    assert any("targetPort" in p for p in broken(
        lambda d: get(d, "Service", "router")["spec"]["ports"][0].update({"targetPort": "http"})))
    assert any("missing ConfigMap" in p for p in broken(
        lambda d: pod_spec(get(d, "Deployment", "router"))["containers"][0]["envFrom"][0]["configMapRef"]
        .update({"name": "nexus-cfg"})))
    assert any("not in nexus-redis" in p for p in broken(
        lambda d: pod_spec(get(d, "DaemonSet", "engine"))["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]
        .update({"key": "pass"})))
    assert any("missing PersistentVolumeClaim nexus-modles" in p for p in broken(
        lambda d: next(v for v in pod_spec(get(d, "Deployment", "router"))["volumes"] if v["name"] == "models")
        ["persistentVolumeClaim"].update({"claimName": "nexus-modles"})))
    assert any("scaleTargetRef" in p for p in broken(
        lambda d: get(d, "HorizontalPodAutoscaler", "router")["spec"]["scaleTargetRef"].update({"name": "routr"})))
    assert any("not a container port" in p for p in broken(
        lambda d: pod_spec(get(d, "Deployment", "compiler"))["containers"][0]["readinessProbe"]["grpc"]
        .update({"port": 50051})))
    assert any("does not match the pod labels" in p for p in broken(
        lambda d: get(d, "StatefulSet", "redis")["spec"]["selector"]["matchLabels"].update({"x": "y"})))


@pytest.mark.parametrize("kind,name", [("Deployment", "router"), ("Deployment", "compiler"), ("DaemonSet", "engine")])
def test_nexus_pods_use_grpc_probes_on_their_grpc_port(docs, kind, name):
    port = DEFAULT_PORTS[name]
    obj = get(docs, kind, name)
    (c,) = pod_spec(obj)["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["grpc"] == port
    # Prometheus: the metrics port is the service config's default and the pod says so for scrapers
    assert set(ports) == {"grpc", "metrics"}
    assert obj["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    from services.common.config import load_config
    cfg_cls = {"router": "services.router.config:RouterConfig", "compiler": "services.compiler.config:CompilerConfig",
               "engine": "services.engine.config:EngineConfig"}[name]
    mod, cls = cfg_cls.split(":")
    default = load_config(getattr(__import__(mod, fromlist=[cls]), cls), prefix="NEXUS_X_", env={})
    assert ports["metrics"] == default.metrics_port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == port, probe
    svc = get(docs, "Service", name)
    assert svc["spec"]["ports"][0]["port"] == port and svc["spec"]["ports"][0]["targetPort"] == "grpc"
    cm = get(docs, "ConfigMap", "nexus-config")["data"]
    assert cm[f"NEXUS_{name.upper()}_PORT"] == str(port)
    # Hardened like the compose services: non-root, read-only root, no capabilities.
    spec = pod_spec(get(docs, kind, name))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}


def test_the_openai_front_runs_beside_the_engine_with_an_http_readiness_probe(docs):
    """The OpenAI front: the router's image running `nexus serve openai` on 8000, configured by the ConfigMap's
    NEXUS_OPENAI_* keys (router and engine by Service name), on the engine's nodes (the engine Service is node-local),
    ready only while GET /health is 200 (router and engine SERVING), alive while its port answers."""
    cm = get(docs, "ConfigMap", "nexus-config")["data"]
    obj = get(docs, "Deployment", "openai")
    spec = pod_spec(obj)
    (c,) = spec["containers"]
    assert c["image"] == pod_spec(get(docs, "Deployment", "router"))["containers"][0]["image"]
    assert c["command"] == ["nexus", "serve", "openai"]
    assert c["envFrom"] == [{"configMapRef": {"name": "nexus-config"}}]
    port = DEFAULT_PORTS["openai"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": port}
    assert cm["NEXUS_OPENAI_PORT"] == str(port) and cm["NEXUS_OPENAI_HOST"] == "0.0.0.0"
    for key, svc in (("NEXUS_OPENAI_ROUTER_ADDR", "router"), ("NEXUS_OPENAI_ENGINE_ADDR", "engine")):
        host, p = cm[key].split(":")
        assert host == svc and get(docs, "Service", svc)["spec"]["ports"][0]["port"] == int(p)
    assert spec["nodeSelector"] == pod_spec(get(docs, "DaemonSet", "engine"))["nodeSelector"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert "tcpSocket" in c["livenessProbe"] and "tcpSocket" in c["startupProbe"]
    svc = get(docs, "Service", "openai")
    assert svc["spec"]["ports"][0]["port"] == port and svc["spec"]["ports"][0]["targetPort"] == "http"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}


def test_configmap_is_valid_service_config_and_router_reaches_the_compiler_service(docs):
    cm = get(docs, "ConfigMap", "nexus-config")["data"]
    store = {f"NEXUS_{s.upper()}_STORE_URL": "redis://:pw@redis:6379/0" for s in ("router", "compiler", "engine")}
    assert config_problems({**cm, **store}, "nexus-config") == []
    host, port = cm["NEXUS_ROUTER_COMPILER_ADDR"].split(":")
    assert get(docs, "Service", host)["spec"]["ports"][0]["port"] == int(port)
    for kind, name in (("Deployment", "router"), ("Deployment", "compiler"), ("DaemonSet", "engine")):
        env = {e["name"]: e.get("value") for e in pod_spec(get(docs, kind, name))["containers"][0]["env"]}
        assert env[f"NEXUS_{name.upper()}_STORE_URL"] == "redis://:$(REDIS_PASSWORD)@redis:6379/0"
    assert get(docs, "Service", "redis")["spec"]["ports"][0]["port"] == 6379


@pytest.mark.parametrize("kind, name, key", [("Deployment", "router", "NEXUS_ROUTER_GATE_MODEL_DIR"),
                                             ("DaemonSet", "engine", "NEXUS_ENGINE_SLOT_MODEL")])
def test_trained_models_come_read_only_from_the_shared_claim(docs, kind, name, key):
    """The router's gate model and the engine's slot reader: the paths the ConfigMap gives lie under a read-only mount
    of the nexus-models claim, which every replica on any node can mount (ReadOnlyMany)."""
    path = get(docs, "ConfigMap", "nexus-config")["data"][key]
    spec = pod_spec(get(docs, kind, name))
    claim_volumes = {v["name"] for v in spec["volumes"]
                     if v.get("persistentVolumeClaim", {}).get("claimName") == "nexus-models"
                     and v["persistentVolumeClaim"].get("readOnly")}
    mounts = [m for m in spec["containers"][0]["volumeMounts"]
              if m["name"] in claim_volumes and path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1 and mounts[0]["readOnly"] is True
    assert get(docs, "PersistentVolumeClaim", "nexus-models")["spec"]["accessModes"] == ["ReadOnlyMany"]


def test_router_scales_out_and_engine_runs_on_unified_memory_nodes(docs):
    hpa = get(docs, "HorizontalPodAutoscaler", "router")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "router"}
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    engine = get(docs, "DaemonSet", "engine")
    assert pod_spec(engine)["nodeSelector"] == {"nexus.dev/unified-memory": "true"}
    assert get(docs, "Service", "engine")["spec"]["internalTrafficPolicy"] == "Local"
    redis = get(docs, "StatefulSet", "redis")
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_manifests_validate_against_the_kubernetes_schema(docs):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate==1.37.0")
    for d in docs:
        kv.validate(d, "1.30.0", strict=True)  # raises ValidationError naming the field


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not on PATH")
def test_kubectl_kustomize_renders_every_object_in_the_namespace(docs):
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert len(rendered) == len(docs)
    for d in rendered:
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nexus"
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "nexus"
    assert check_k8s(rendered) == []
