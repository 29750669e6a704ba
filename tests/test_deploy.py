"""The Kubernetes deployment files: valid for KubeRay and Kubernetes, in step with the Serve config
`specserve serve` deploys, and consistent with each other and with the code's placement.

Everything checked is in the repository (the RayService schema was extracted from the CRD by
`make manifests CRD=...`), so this runs on a fresh clone.
"""

from __future__ import annotations

import json
import re
import shlex
from importlib.metadata import version

import jsonschema
import kubernetes_validate
import pytest
import yaml

from specserve.cluster.config import DEFAULT_METRICS_PORT, ServiceConfig
from specserve.router.config import ROUTER_NODE
from specserve.workers.config import DRAFT_DEVICE, TARGET_DEVICE
from specserve.cluster.kuberay import (RAYSERVICE, RAYSERVICE_SCHEMA, SERVE_CONFIG, crd_schema, embed_serve_config,
                                       manifest_problems)

DEPLOY = SERVE_CONFIG.parent
REPO = DEPLOY.parent
SHARED_CRD = REPO.parent / "shared" / "kuberay" / "ray.io_rayservices.yaml"  # beside the work folder
KUBERNETES_VERSION = "1.33.0"  # the schemas kubernetes-validate checks core objects against
GROUPS = ("router", "targets", "drafts")  # the worker groups, by what they run


@pytest.fixture(scope="module")
def rayservice() -> dict:
    return yaml.safe_load(RAYSERVICE.read_text())


@pytest.fixture(scope="module")
def cluster_spec(rayservice) -> dict:
    return rayservice["spec"]["rayClusterConfig"]


@pytest.fixture(scope="module")
def serve_config() -> dict:
    return yaml.safe_load(SERVE_CONFIG.read_text())


def groups(cluster_spec: dict) -> dict[str, dict]:
    """Every pod group by name, the head included."""
    return {"head": cluster_spec["headGroupSpec"]} | {g["groupName"]: g for g in cluster_spec["workerGroupSpecs"]}


def container(group: dict) -> dict:
    (only,) = group["template"]["spec"]["containers"]
    return only


def custom_resources(group: dict) -> dict[str, float]:
    """rayStartParams' resources. KubeRay pastes the value into the `ray start` command line, so it
    is a JSON object quoted for the shell: read it as the shell would."""
    raw = group["rayStartParams"].get("resources")
    return json.loads(shlex.split(raw)[0]) if raw else {}


def ports(group: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(group).get("ports", [])}


def selects(selector: dict[str, str], group: dict) -> bool:
    labels = group["template"]["metadata"]["labels"]
    return all(labels.get(key) == value for key, value in selector.items())


# --- one source of truth ---------------------------------------------------------------------

def test_serve_config_v2_is_the_serve_config_file_verbatim(rayservice, serve_config):
    text = SERVE_CONFIG.read_text()
    assert rayservice["spec"]["serveConfigV2"] == text, "run `make manifests` after editing deploy/serve_config.yaml"
    assert yaml.safe_load(rayservice["spec"]["serveConfigV2"]) == serve_config
    assert embed_serve_config(RAYSERVICE.read_text(), text) == RAYSERVICE.read_text()  # in step: nothing to do


def test_embedding_replaces_only_the_block():
    manifest = "a: 1\nspec:\n  serveConfigV2: |\n    old: 1\n\n    older: 2\n  next: 3\n"
    assert embed_serve_config(manifest, "new: 1\n\nnewer: [2]\n") == (
        "a: 1\nspec:\n  serveConfigV2: |\n    new: 1\n\n    newer: [2]\n  next: 3\n")
    with pytest.raises(ValueError, match="exactly one line"):
        embed_serve_config("spec: {}\n", "x: 1\n")


def test_serve_config_v2_parses_with_ray_serves_schema_and_ours(rayservice):
    from ray.serve.schema import ServeDeploySchema

    parsed = ServeDeploySchema.model_validate(yaml.safe_load(rayservice["spec"]["serveConfigV2"]))
    (app,) = parsed.applications
    assert app.import_path == "specserve.cluster.app:build_app"
    ServiceConfig.model_validate(app.args)  # and the args are a ServiceConfig, unknown keys refused


# --- valid for KubeRay and Kubernetes ---------------------------------------------------------

def test_the_rayservice_validates_against_the_crd_schema(rayservice):
    schema = json.loads(RAYSERVICE_SCHEMA.read_text())
    assert rayservice["apiVersion"] == "ray.io/v1" and rayservice["kind"] == "RayService"
    jsonschema.validate(rayservice, schema)
    assert manifest_problems(rayservice, schema) == []


def test_the_validation_catches_mistakes(rayservice):
    schema = json.loads(RAYSERVICE_SCHEMA.read_text())
    wrong_type = json.loads(json.dumps(rayservice))
    wrong_type["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["rayStartParams"]["num-cpus"] = 1  # not a string
    assert manifest_problems(wrong_type, schema) == [
        "spec.rayClusterConfig.workerGroupSpecs.0.rayStartParams.num-cpus: 1 is not of type 'string'"]
    misspelt = json.loads(json.dumps(rayservice))
    misspelt["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["rayStartParam"] = {}
    assert manifest_problems(misspelt, schema) == [
        "spec.rayClusterConfig.workerGroupSpecs[0].rayStartParam: not a field of the RayService"]


@pytest.mark.skipif(not SHARED_CRD.exists(), reason="the KubeRay CRDs are not beside this clone")
def test_the_schema_in_the_repository_is_the_crds():
    assert json.loads(RAYSERVICE_SCHEMA.read_text()) == crd_schema(yaml.safe_load(SHARED_CRD.read_text()))


def test_the_service_and_every_pod_template_validate_against_kubernetes(cluster_spec):
    service = yaml.safe_load((DEPLOY / "kuberay" / "service.yaml").read_text())
    kubernetes_validate.validate(service, KUBERNETES_VERSION, strict=True)
    for name, group in groups(cluster_spec).items():
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": group["template"]}
        kubernetes_validate.validate(template, KUBERNETES_VERSION, strict=True)


# --- consistent with the code and with each other ---------------------------------------------

def test_each_group_advertises_the_resource_its_processes_ask_for(cluster_spec, serve_config):
    config = ServiceConfig.model_validate(serve_config["applications"][0]["args"])
    by_name = groups(cluster_spec)
    assert custom_resources(by_name["head"]) == {} and by_name["head"]["rayStartParams"]["num-cpus"] == "0"
    assert set(custom_resources(by_name["router"])) == {config.router.node_resource} == {ROUTER_NODE}
    assert set(custom_resources(by_name["targets"])) == {config.target.device_resource} == {TARGET_DEVICE}
    assert set(custom_resources(by_name["drafts"])) == {config.draft_pool.device_resource} == {DRAFT_DEVICE}
    most = {name: g["maxReplicas"] * sum(custom_resources(g).values()) for name, g in by_name.items() if name != "head"}
    assert most["targets"] >= config.target.replicas and most["drafts"] >= config.draft_pool.workers
    assert by_name["drafts"]["replicas"] * custom_resources(by_name["drafts"])[DRAFT_DEVICE] >= config.draft_pool.workers


def test_only_the_target_group_has_gpus(cluster_spec):
    for name, group in groups(cluster_spec).items():
        gpus = container(group)["resources"]["limits"].get("nvidia.com/gpu")
        assert (gpus is not None) == (name == "targets"), name
    assert container(groups(cluster_spec)["targets"])["resources"]["limits"]["nvidia.com/gpu"] == str(
        int(custom_resources(groups(cluster_spec)["targets"])[TARGET_DEVICE]))  # a device per GPU


def test_the_service_reaches_the_router_and_only_when_it_is_serving(cluster_spec, serve_config):
    service = yaml.safe_load((DEPLOY / "kuberay" / "service.yaml").read_text())
    selector = service["spec"]["selector"]
    by_name = groups(cluster_spec)
    assert [name for name, group in by_name.items() if selects(selector, group)] == ["router"]
    router_port = serve_config["applications"][0]["args"]["router"]["port"]
    named = {p["name"]: p for p in service["spec"]["ports"]}
    assert named["grpc"]["port"] == router_port and ports(by_name["router"])["grpc"] == router_port
    http_port = serve_config["applications"][0]["args"]["router"]["http_port"]  # the OpenAI API
    assert named["http"]["port"] == http_port == ports(by_name["router"])["http"]
    assert named["metrics"]["port"] == DEFAULT_METRICS_PORT == ports(by_name["router"])["metrics"]
    assert all(p["targetPort"] in ports(by_name["router"]) for p in service["spec"]["ports"])
    # An exec probe: Kubernetes' native gRPC probe cannot speak the TLS the client API serves.
    probe = container(by_name["router"])["readinessProbe"]["exec"]["command"]
    assert probe == ["python", "-m", "specserve.cluster.probe", f"localhost:{router_port}", "specserve.v1.SpecServe"]


def test_every_pod_exports_metrics_where_the_pod_monitor_scrapes(cluster_spec):
    monitor = yaml.safe_load((DEPLOY / "kuberay" / "podmonitor.yaml").read_text())
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    for name, group in groups(cluster_spec).items():
        assert selects(monitor["spec"]["selector"]["matchLabels"], group), name
        assert ports(group)[endpoint["port"]] == DEFAULT_METRICS_PORT, name
        assert group["rayStartParams"]["metrics-export-port"] == str(DEFAULT_METRICS_PORT), name


def test_every_pod_runs_this_version_without_pinning_cores(cluster_spec):
    from specserve.workers.grpc_host import PINNING_ENV

    assert cluster_spec["rayVersion"] == version("ray")
    for name, group in groups(cluster_spec).items():
        gpu = "nvidia.com/gpu" in container(group).get("resources", {}).get("limits", {})
        # the CUDA build where the pod holds a GPU, the CPU build elsewhere (`make image` builds both)
        assert container(group)["image"] == f"specserve:{version('specserve')}{'-cuda' * gpu}", name
        assert {"name": PINNING_ENV, "value": "off"} in container(group)["env"], name
    assert any("nvidia.com/gpu" in container(group).get("resources", {}).get("limits", {})
               for group in groups(cluster_spec).values())


def test_make_image_builds_each_variant_with_its_torch():
    """The Makefile's tags and build arguments agree with the manifest's images and the Dockerfile."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "ARG TORCH=cuda" in dockerfile and "cpu) index=https://download.pytorch.org/whl/cpu" in dockerfile
    makefile = (REPO / "Makefile").read_text()
    assert "--build-arg TORCH=cuda -t specserve:$$v-cuda" in makefile
    assert "--build-arg TORCH=cpu -t specserve:$$v " in makefile


def test_the_dockerfile_copies_what_exists_and_the_build_context_sends_it():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    sources = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert {"cluster", "workers", "router", "proto", "pyproject.toml"} <= set(sources)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for source in sources:
        assert (REPO / source).exists(), source
        top = source.split("/")[0]
        assert f"!{top}" in ignore or f"!{top}/" in ignore, f"{source} is not sent in the build context"
    assert re.search(r"specserve zoo build --preset \"\$ZOO_PRESET\"", dockerfile)  # the demo zoo is baked in


# --- secrets: from mounted files, never in the manifests ---------------------------------------

SECRETS = DEPLOY / "kuberay" / "secrets.example.yaml"


def test_the_example_secrets_validate_against_kubernetes():
    for secret in yaml.safe_load_all(SECRETS.read_text()):
        assert secret["kind"] == "Secret", secret["metadata"]["name"]
        kubernetes_validate.validate(secret, KUBERNETES_VERSION, strict=True)


def test_the_placeholder_tokens_would_be_refused_at_startup(tmp_path):
    from specserve.workers.security import API_TOKEN_ENV, SecuritySettings

    auth = next(s for s in yaml.safe_load_all(SECRETS.read_text()) if s["metadata"]["name"] == "specserve-auth")
    for placeholder in auth["stringData"].values():
        with pytest.raises(ValueError, match="printable ASCII without spaces"):
            SecuritySettings.from_env({API_TOKEN_ENV: placeholder})


def test_every_pod_reads_tokens_and_certificates_from_the_secrets(cluster_spec):
    """Each variable names a file in a read-only mount of the Secret holding that key; no token is a
    value in the manifest, and nothing about security is in the Serve config."""
    from specserve.workers.security import (API_TOKEN_ENV, API_TOKEN_FILE_ENV, INTERNAL_TOKEN_ENV,
                                            INTERNAL_TOKEN_FILE_ENV, TLS_CA, TLS_CERT, TLS_DIR_ENV, TLS_KEY)

    secrets = {s["metadata"]["name"]: s for s in yaml.safe_load_all(SECRETS.read_text())}
    for name, group in groups(cluster_spec).items():
        env = {e["name"]: e.get("value") for e in container(group)["env"]}
        assert API_TOKEN_ENV not in env and INTERNAL_TOKEN_ENV not in env, name
        mounts = {m["mountPath"]: m for m in container(group)["volumeMounts"]}
        volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}

        def secret_at(directory: str) -> dict:
            mount = mounts[directory]
            assert mount["readOnly"], (name, directory)
            return secrets[volumes[mount["name"]]["secret"]["secretName"]]

        for variable in (API_TOKEN_FILE_ENV, INTERNAL_TOKEN_FILE_ENV):
            directory, _, key = env[variable].rpartition("/")
            assert key in secret_at(directory)["stringData"], (name, variable)
        tls = secret_at(env[TLS_DIR_ENV])
        assert tls["type"] == "kubernetes.io/tls" and set(tls["stringData"]) == {TLS_CERT, TLS_KEY, TLS_CA}, name
    assert "SPECSERVE_" not in SERVE_CONFIG.read_text() and "token" not in SERVE_CONFIG.read_text().lower()


def test_the_ray_autoscaler_sizes_each_group_within_its_bounds(rayservice, cluster_spec, serve_config):
    """KubeRay runs the Ray autoscaler, and every group starts within its bounds. Where the Serve
    config autoscales target replicas or the draft pool, its group can grow to hold the most it asks for."""
    assert rayservice["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    assert rayservice["spec"]["rayClusterConfig"]["autoscalerOptions"]["idleTimeoutSeconds"] > 0
    for name, group in groups(cluster_spec).items():
        if name != "head":
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], name
    from specserve.cluster.config import ServiceConfig

    args = ServiceConfig.model_validate(serve_config["applications"][0]["args"])
    targets, drafts = groups(cluster_spec)["targets"], groups(cluster_spec)["drafts"]
    most = args.target.autoscaling.max_replicas if args.target.autoscaling else args.target.replicas
    assert most <= targets["maxReplicas"] * custom_resources(targets)[TARGET_DEVICE]
    most = args.draft_pool.autoscaling.max_workers if args.draft_pool.autoscaling else args.draft_pool.workers
    assert most <= drafts["maxReplicas"] * custom_resources(drafts)[DRAFT_DEVICE]
