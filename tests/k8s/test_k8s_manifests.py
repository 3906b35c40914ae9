"""The kustomizations under k8s/: they render, every object validates, and they say what we mean.

Rendering uses ``kubectl kustomize`` (or ``kustomize build``) when one is on the PATH, else the
Python subset in ``k8s_kustomize.py``; with a binary present both are compared object by object.
"""

from __future__ import annotations

import copy
import hashlib
import re

import pytest
from k8s_fixtures import K8S, kustomizations, render
from k8s_kustomize import Unsupported, build_python, build_with_binary, kustomize_command
from k8s_validate import (
    CRD_DIR,
    defaulted,
    parse_quantity,
    pod_specs,
    reference_problems,
    validate_objects,
)

from sweeps.remote import k8s as render_mod
from sweeps.remote import k8s_platform as platform

ALL = kustomizations()
PLATFORM = "overlays/example"
SWEEP = "overlays/example-sweep"


def test_every_expected_kustomization_exists():
    assert {"base", "sweep", "rbac-sweep-submitter", PLATFORM, SWEEP} <= set(ALL)


@pytest.mark.parametrize("rel", ALL)
def test_kustomization_renders_and_every_object_validates(rel):
    objs = render(rel)
    assert objs, f"{rel} rendered nothing"
    assert validate_objects(objs, references=False) == []


@pytest.mark.parametrize("rel", ALL)
def test_python_kustomize_matches_the_binary(rel):
    command = kustomize_command()
    if command is None:
        pytest.skip("no kubectl or kustomize on PATH: the Python renderer is the only one")
    assert build_python(K8S / rel) == build_with_binary(K8S / rel, command)


@pytest.mark.parametrize(
    ("renders", "complete"),
    [
        (["base"], False),  # Secrets declared, filled by an overlay
        (["base", "sweep"], False),
        (["rbac-sweep-submitter"], True),
        ([PLATFORM], True),
        ([PLATFORM, SWEEP], True),  # the example sweep runs in the example platform's namespace
    ],
)
def test_references_resolve(renders, complete):
    objs = [o for rel in renders for o in render(rel)]
    assert reference_problems(objs, complete=complete) == []


def test_the_sweep_alone_lacks_the_platform():
    problems = reference_problems(render(SWEEP))
    assert problems and all("critbatch-s3" in p or "critbatch-optuna" in p for p in problems)
    assert any("critbatch-optuna" in p for p in problems)


def test_vendored_crds_are_the_kuberay_release_files():
    source = (CRD_DIR / "SOURCE.txt").read_text()
    assert "v1.7.0" in source and "Apache License 2.0" in source
    assert (CRD_DIR / "LICENSE-APACHE-2.0.txt").read_text().lstrip().startswith("Apache License")
    for name in ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml"):
        digest = hashlib.sha256((CRD_DIR / name).read_bytes()).hexdigest()
        assert f"{name}" in source and digest in source, f"{name} differs from SOURCE.txt"


# ---- what the manifests must say ------------------------------------------------------------------


def _by(objs, kind, name=None):
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert hits, f"no {kind} {name or ''}"
    return hits[0] if name else hits


def _containers(obj):
    for path, pod in pod_specs(obj):
        for group in ("initContainers", "containers"):
            for c in pod.get(group) or []:
                yield path, pod, c


@pytest.mark.parametrize("rel", ALL)
def test_every_container_is_guaranteed_qos(rel):
    for obj in render(rel):
        for path, _, c in _containers(obj):
            res = c.get("resources", {})
            where = f"{obj['kind']}/{obj['metadata']['name']} {path} {c['name']}"
            assert {"cpu", "memory"} <= set(res.get("requests", {})), where
            assert res.get("requests") == res.get("limits"), where
    for obj in render(rel):
        if obj["kind"] == "RayCluster" and obj["spec"].get("enableInTreeAutoscaling"):
            auto = obj["spec"]["autoscalerOptions"]["resources"]
            assert auto["requests"] == auto["limits"]


_RESTRICTED_VOLUMES = {
    "name",
    "configMap",
    "emptyDir",
    "secret",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "ephemeral",
    "csi",
}


@pytest.mark.parametrize("rel", ALL)
def test_every_pod_meets_the_restricted_pod_security_standard(rel):
    for obj in render(rel):
        for path, pod in pod_specs(obj):
            where = f"{obj['kind']}/{obj['metadata']['name']} {path}"
            psc = pod.get("securityContext", {})
            assert psc.get("runAsNonRoot") is True and psc.get("runAsUser", 1) != 0, where
            assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), where
            for v in pod.get("volumes") or []:
                assert set(v) <= _RESTRICTED_VOLUMES, f"{where}: volume {v['name']}"
            for group in ("initContainers", "containers"):
                for c in pod.get(group) or []:
                    sc = c.get("securityContext", {})
                    assert sc.get("allowPrivilegeEscalation") is False, f"{where} {c['name']}"
                    assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where} {c['name']}"
                    assert not sc.get("privileged"), f"{where} {c['name']}"


def test_example_namespace_enforces_restricted_and_holds_everything():
    objs = render(PLATFORM)
    ns = _by(objs, "Namespace", "critbatch")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert all(o["metadata"].get("namespace") == "critbatch" for o in objs if o["kind"] != "Namespace")
    assert all(o["metadata"].get("namespace") == "critbatch" for o in render(SWEEP))


def test_base_secrets_hold_no_data_and_the_example_fills_every_declared_key():
    for secret in _by(render("base"), "Secret"):
        assert not secret.get("data") and not secret.get("stringData"), secret["metadata"]["name"]
    assert reference_problems(render(PLATFORM), complete=True) == []
    for env in (K8S / PLATFORM / "secrets").glob("*.env"):
        assert "EXAMPLE VALUES" in env.read_text().splitlines()[0], env.name


def test_long_lived_raycluster_for_the_service():
    objs = render(PLATFORM)
    rc = defaulted(_by(objs, "RayCluster", "critbatch-ray"))
    spec = rc["spec"]
    assert spec["rayVersion"] == render_mod.RAY_VERSION
    assert spec["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
    assert spec["authOptions"] == {"mode": "token", "secretName": "critbatch-ray-token"}
    assert spec["enableInTreeAutoscaling"] is True
    (workers,) = spec["workerGroupSpecs"]
    assert workers["minReplicas"] == 0 and workers["maxReplicas"] == 2  # the example's patch
    # the same environment as a rendered sweep's Ray pods: MLflow, Tune storage, S3 keys; on the head, where
    # the driver runs, the Optuna storage too
    from sweeps.remote.k8s_platform import OPTUNA_STORAGE_SECRET, optuna_storage_env

    sweep_env = render_mod.ray_env()
    head_env = sweep_env + optuna_storage_env(OPTUNA_STORAGE_SECRET)
    for tmpl, env in [(spec["headGroupSpec"]["template"], head_env), (workers["template"], sweep_env)]:
        (c,) = tmpl["spec"]["containers"]
        assert c["env"] == env


def test_service_deployment_talks_to_ray_and_mlflow_with_tokens_and_no_api_rights():
    objs = render(PLATFORM)
    dep = _by(objs, "Deployment", "critbatch")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"] == ["critbatch", "serve", "--host", "0.0.0.0", "--port", "8000"]
    env = {e["name"]: e for e in c["env"]}
    rc = _by(objs, "RayCluster", "critbatch-ray")
    assert env["RAY_ADDRESS"]["value"] == f"http://{rc['metadata']['name']}-head-svc:8265"
    assert env["MLFLOW_TRACKING_URI"]["value"] == render_mod.MLFLOW_TRACKING_URI
    assert env["CRITBATCH_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "critbatch-api-token", "key": "token"}
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == rc["spec"]["authOptions"]["secretName"]
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    svc = _by(objs, "Service", "critbatch")
    assert svc["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # its ServiceAccount: no token in the pod, and bound to no Role at all
    sa = _by(objs, "ServiceAccount", "critbatch")
    assert pod["serviceAccountName"] == "critbatch"
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert not [o for o in objs if o["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]


def test_sweep_submitter_role_is_minimal():
    objs = render("rbac-sweep-submitter")
    assert sorted(o["kind"] for o in objs) == ["Role", "RoleBinding", "ServiceAccount"]
    role = _by(objs, "Role", "critbatch-sweep-submitter")
    rules = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert rules == {
        ("ray.io", "rayjobs"): {"create", "get", "list", "watch", "patch", "delete"},
        ("", "configmaps"): {"create", "get", "patch", "delete"},
    }
    rb = _by(objs, "RoleBinding", "critbatch-sweep-submitter")
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "critbatch-sweep-submitter"}]


def test_mlflow_server_postgres_minio_and_schema_job():
    objs = render(PLATFORM)
    dep = _by(objs, "Deployment", "critbatch-mlflow")
    pod = dep["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://")
    assert "@critbatch-postgres:5432/" in env["MLFLOW_BACKEND_STORE_URI"]
    assert env["MLFLOW_ARTIFACTS_DESTINATION"] == "s3://mlflow-artifacts"
    assert env["MLFLOW_S3_ENDPOINT_URL"] == platform.S3_ENDPOINT_URL
    assert "--serve-artifacts" in server["args"]
    (hosts,) = [a.split("=", 1)[1].split(",") for a in server["args"] if a.startswith("--allowed-hosts=")]
    host, port = render_mod.MLFLOW_TRACKING_URI.split("//")[1].split(":")
    assert {host, f"{host}:{port}", f"{host}.$(POD_NAMESPACE).svc.cluster.local:{port}", "localhost:*"} <= set(hosts)
    assert "*" not in hosts
    assert [c["name"] for c in pod["initContainers"]] == ["wait-for-schema"]
    job = _by(objs, "Job", "critbatch-mlflow-db-upgrade")
    (upgrade,) = job["spec"]["template"]["spec"]["containers"]
    assert upgrade["args"][:3] == ["mlflow", "db", "upgrade"] and upgrade["image"] == server["image"]
    assert _by(objs, "StatefulSet", "critbatch-postgres")["spec"]["volumeClaimTemplates"]
    assert _by(objs, "StatefulSet", "critbatch-minio")["spec"]["volumeClaimTemplates"]
    setup = _by(objs, "Job", "critbatch-minio-setup")["spec"]["template"]["spec"]["containers"][0]
    script = setup["command"][-1]
    assert "mlflow-artifacts" in script and platform.TUNE_STORAGE_URI.removeprefix("s3://") in script


def test_images_are_pinned():
    for rel in ALL:
        for obj in render(rel):
            for _, _, c in _containers(obj):
                assert re.search(r":[\w.][\w.-]*$|@sha256:", c["image"]), c["image"]
                assert not c["image"].endswith(":latest"), c["image"]


# ---- the validator catches what it should ------------------------------------------------------------


def _rayjob():
    return copy.deepcopy(_by(render(SWEEP), "RayJob", "shakespeare-char"))


def _set(path, value):
    def mutate(o):
        node = o
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


_GROUP = ["spec", "rayClusterSpec", "workerGroupSpecs", 0]
_HEAD = ["spec", "rayClusterSpec", "headGroupSpec"]
_HEAD_C = [*_HEAD, "template", "spec", "containers", 0]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_set(["spec", "bogus"], 1), "'bogus' was unexpected"),
        (_set([*_HEAD_C, "imagePullPolcy"], "Always"), "'imagePullPolcy' was unexpected"),
        (_set(["metadata", "nme"], "x"), "'nme' was unexpected"),
        (_set(["spec", "submissionMode"], 7), "is not of type 'string'"),
        (_set(["spec", "activeDeadlineSeconds"], 2**31), "int32"),
        (_set(["spec", "managedBy"], "someone"), "CEL rules"),
        (_set([*_GROUP, "minReplicas"], 9), "minReplicas 9 > maxReplicas"),
        (_set(["spec", "shutdownAfterJobFinishes"], False), "ttlSecondsAfterFinished needs shutdownAfterJobFinishes"),
        (_set(["metadata", "name"], "a" * 48), "at most 47 characters"),
        (_set(["metadata", "name"], "9lives"), "DNS-1035"),
        (_set([*_HEAD, "resources"], {"CPU": "1"}), "both rayStartParams and resources"),
        (_set([*_HEAD, "rayStartParams", "labels"], "a=b"), "rayStartParams['labels']"),
        (_set(["spec", "rayClusterSpec", "rayVersion"], "2.51.0"), "Ray >= 2.52.0"),
        (_set(["spec", "activeDeadlineSeconds"], 0), "activeDeadlineSeconds must be > 0"),
        (_set(["spec", "runtimeEnvYAML"], "[unclosed"), "runtimeEnvYAML is not YAML"),
        (_set([*_HEAD_C, "ports", 1, "containerPort"], 6379), "duplicate entry"),
        (_set([*_HEAD_C, "ports", 0, "name"], "gcs-server-port-x"), "bad port name"),
        (_set([*_HEAD_C, "resources", "requests", "cpu"], "3"), "request 3 > limit 2"),
        (_set(["spec", "submitterPodTemplate", "spec", "restartPolicy"], "Always"), "restartPolicy must be Never"),
    ],
)
def test_validator_rejects(mutate, expected):
    obj = _rayjob()
    mutate(obj)
    problems = validate_objects([obj], references=False)
    assert any(expected in p for p in problems), problems


def _rules(*rules, **spec):
    """The example RayJob with deletionRules (each ``(condition, policy)``) instead of shutdownAfterJobFinishes."""
    obj = _rayjob()
    del obj["spec"]["shutdownAfterJobFinishes"], obj["spec"]["ttlSecondsAfterFinished"]
    obj["spec"]["deletionStrategy"] = {"deletionRules": [{"condition": c, "policy": p} for c, p in rules]}
    obj["spec"].update(spec)
    return obj


_FAILED = {"jobDeploymentStatus": "Failed"}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (lambda: _rules(({"jobStatus": "FAILED", **_FAILED}, "DeleteCluster")), "cannot be used together"),
        (lambda: _rules(({"ttlSeconds": 5}, "DeleteCluster")), "either the JobStatus or the JobDeploymentStatus"),
        (lambda: _rules((_FAILED, "DeleteCluster"), shutdownAfterJobFinishes=True), "mutually exclusive"),
        (lambda: _rules((_FAILED, "DeleteCluster"), (_FAILED, "DeleteCluster")), "duplicate rule"),
        (
            lambda: _rules(
                ({**_FAILED, "ttlSeconds": 60}, "DeleteWorkers"), ({**_FAILED, "ttlSeconds": 30}, "DeleteCluster")
            ),
            "DeleteCluster TTL (30) must be >= DeleteWorkers TTL (60)",
        ),
        (lambda: _rules((_FAILED, "DeleteEverything")), "is not one of"),
        (lambda: _rules(), "should be non-empty"),
    ],
)
def test_validator_rejects_bad_deletion_rules(obj, expected):
    problems = validate_objects([obj()], references=False)
    assert any(expected in p for p in problems), problems


def test_validator_accepts_good_deletion_rules_and_legacy_policies():
    good = _rules(
        ({"jobStatus": "SUCCEEDED"}, "DeleteCluster"),
        ({**_FAILED, "ttlSeconds": 300}, "DeleteCluster"),
        ({**_FAILED, "ttlSeconds": 600}, "DeleteSelf"),
    )
    assert validate_objects([good], references=False) == []
    legacy = _rayjob()
    legacy["spec"]["deletionStrategy"] = {
        "onSuccess": {"policy": "DeleteCluster"},
        "onFailure": {"policy": "DeleteNone"},
    }
    assert any("DeleteNone with shutdownAfterJobFinishes" in p for p in validate_objects([legacy], references=False))
    legacy["spec"]["deletionStrategy"]["onFailure"]["policy"] = "DeleteCluster"
    assert validate_objects([legacy], references=False) == []
    del legacy["spec"]["deletionStrategy"]["onFailure"]
    assert any("BOTH onSuccess and onFailure" in p for p in validate_objects([legacy], references=False))


def test_validator_applies_crd_defaults():
    obj = _rayjob()
    del obj["spec"]["submissionMode"]
    del obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplicas"]
    assert validate_objects([obj], references=False) == []  # defaults satisfy "required"
    d = defaulted(obj)
    assert d["spec"]["submissionMode"] == "K8sJobMode"
    assert d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplicas"] == 2**31 - 1
    assert d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["numOfHosts"] == 1
    # a default that breaks an operator rule is caught: minReplicas above the defaulted maximum
    obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplicas"] = 1
    assert any("minReplicas 2 > maxReplicas 1" in p for p in validate_objects([obj], references=False))


def test_validator_rejects_core_unknown_fields_and_bad_names():
    dep = copy.deepcopy(_by(render(PLATFORM), "Deployment", "critbatch"))
    dep["spec"]["template"]["spec"]["containers"][0]["bogus"] = 1
    dep["metadata"]["labels"]["bad key!"] = "x"
    problems = validate_objects([dep], references=False)
    assert any("'bogus' was unexpected" in p for p in problems)
    assert any("bad key!" in p for p in problems)
    svc = copy.deepcopy(_by(render(PLATFORM), "Service", "critbatch"))
    svc["metadata"]["name"] = "1critbatch"
    assert any("DNS-1035" in p for p in validate_objects([svc], references=False))


def test_reference_check_finds_missing_keys_and_selectors():
    objs = copy.deepcopy(render(PLATFORM))
    _by(objs, "Secret", "critbatch-s3")["data"].pop("AWS_SECRET_ACCESS_KEY")
    _by(objs, "Service", "critbatch-mlflow")["spec"]["selector"]["app.kubernetes.io/instance"] = "nope"
    problems = reference_problems(objs)
    assert any("no key 'AWS_SECRET_ACCESS_KEY'" in p for p in problems)
    assert any("Service/critbatch-mlflow: selector" in p for p in problems)


def test_quantities():
    assert parse_quantity("500m") * 2 == 1
    assert parse_quantity("6Gi") == 6 * 2**30
    assert parse_quantity("1e3") == 1000
    assert parse_quantity(2) == 2
    with pytest.raises(ValueError):
        parse_quantity("2 cores")


def test_python_kustomize_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\nnamePrefix: x-\n")
    with pytest.raises(Unsupported, match="namePrefix"):
        build_python(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [cm.yaml]\npatches:\n- target: {kind: ConfigMap}\n  patch: |\n    metadata: {labels: {a: b}}\n"
    )
    with pytest.raises(Unsupported, match="strategic-merge"):
        build_python(tmp_path)
