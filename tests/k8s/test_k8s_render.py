"""``sweeps.remote.k8s.render_rayjob`` and ``critbatch k8s render``: one sweep as a KubeRay RayJob."""

from __future__ import annotations

import copy
import os
import re

import pytest
import yaml
from k8s_fixtures import EXAMPLE_SPEC, K8S, render
from k8s_rules import ENDINGS, cluster_deleted_when_ended
from k8s_validate import defaulted, reference_problems, validate_objects
from typer.testing import CliRunner

from sweeps.errors import InvalidInput
from sweeps.remote.k8s import (
    KUEUE_QUEUE_LABEL,
    MLFLOW_TRACKING_URI,
    OPTUNA_STORAGE_SECRET,
    S3_SECRET,
    SecretKeyRef,
    TrialPodResources,
    active_deadline_s,
    dump_manifests,
    parse_secret_key_ref,
    rayjob_name,
    render_rayjob,
    trial_pod_resources,
)
from sweeps.spec import SpecError, parse_spec, parse_spec_text

EXAMPLE_TEXT = EXAMPLE_SPEC.read_text()
EXAMPLE = parse_spec_text(EXAMPLE_TEXT)
IMAGE = "registry.example.com/ml/critbatch:0.1.0"


def _spec(**overrides):
    """The example spec with top-level sections replaced (each a dict, merged one level deep)."""
    data = yaml.safe_load(EXAMPLE_TEXT)
    for key, value in overrides.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_spec(data)


def _render(spec=EXAMPLE, namespace="critbatch"):
    cm, rj = render_rayjob(spec, EXAMPLE_TEXT, IMAGE, namespace)
    return cm, rj


# ---- the example sweep ----------------------------------------------------------------------------


def test_example_renders_valid_objects_that_resolve_against_the_platform():
    objs = list(_render())
    assert [o["kind"] for o in objs] == ["ConfigMap", "RayJob"]
    assert validate_objects(objs, references=False) == []
    platform = render("overlays/example")
    assert reference_problems(platform + objs, complete=True) == []


def test_example_rayjob_fields():
    cm, rj = _render()
    assert rj["metadata"]["name"] == "shakespeare-char"
    assert rj["metadata"]["namespace"] == cm["metadata"]["namespace"] == "critbatch"
    spec = rj["spec"]
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["shutdownAfterJobFinishes"] is True
    assert 0 < spec["ttlSecondsAfterFinished"] <= 600
    assert spec["submitterConfig"] == {"backoffLimit": 2}
    assert spec["backoffLimit"] == 1
    assert spec["activeDeadlineSeconds"] == 86400 + 1800  # no budget.wall_clock_s in the example
    assert spec["entrypoint"] == (
        "critbatch run /critbatch/spec/spec.yaml --output /tmp/critbatch-out "
        "--tracking-uri $MLFLOW_TRACKING_URI --sweep-id shakespeare-char --no-progress"
    )
    assert "--address" not in spec["entrypoint"]  # KubeRay sets RAY_ADDRESS
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == "2.60.0"
    assert cluster["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
    assert cluster["authOptions"] == {"mode": "token"}
    (group,) = cluster["workerGroupSpecs"]
    assert group["minReplicas"] == group["replicas"] == group["maxReplicas"] == 2
    (worker,) = group["template"]["spec"]["containers"]
    assert worker["resources"]["requests"] == worker["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert worker["image"] == IMAGE


def test_mlflow_uri_and_storage_reach_every_pod_that_needs_them():
    _, rj = _render()
    cluster = rj["spec"]["rayClusterSpec"]
    pods = {
        "head": cluster["headGroupSpec"]["template"]["spec"],
        "worker": cluster["workerGroupSpecs"][0]["template"]["spec"],
        "submitter": rj["spec"]["submitterPodTemplate"]["spec"],
    }
    for who, pod in pods.items():
        (c,) = pod["containers"]
        env = {e["name"]: e for e in c["env"]}
        assert env["MLFLOW_TRACKING_URI"]["value"] == MLFLOW_TRACKING_URI, who
        if who != "submitter":
            assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == S3_SECRET
            assert env["CRITBATCH_STORAGE_PATH"]["value"].startswith("s3://")
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert mounts["/critbatch/spec"] == "spec"
    (c,) = pods["submitter"]["containers"]
    assert c["name"] == "ray-job-submitter" and "command" not in c  # KubeRay supplies the command
    assert pods["submitter"]["restartPolicy"] == "Never"


def test_configmap_holds_the_spec_text_as_given():
    cm, rj = _render()
    assert cm["metadata"]["name"] == "shakespeare-char-spec"
    assert cm["data"] == {"spec.yaml": EXAMPLE_TEXT}
    volumes = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"]
    assert {"name": "spec", "configMap": {"name": "shakespeare-char-spec"}} in volumes
    assert parse_spec_text(cm["data"]["spec.yaml"]) == EXAMPLE


def test_the_kustomize_sweep_base_is_the_rendered_example():
    """k8s/sweep/rayjob.yaml is what the renderer prints (set CRITBATCH_REGEN_K8S=1 to rewrite it)."""
    objs = render_rayjob(EXAMPLE, EXAMPLE_TEXT, "critbatch:0.1.0", None)
    path = K8S / "sweep" / "rayjob.yaml"
    if os.environ.get("CRITBATCH_REGEN_K8S"):
        header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
        path.write_text(header + dump_manifests(objs))
    assert [d for d in yaml.safe_load_all(path.read_text()) if d] == objs, (
        "k8s/sweep/rayjob.yaml is stale (the example spec or the renderer changed): rewrite it with "
        "CRITBATCH_REGEN_K8S=1 .venv/bin/python -m pytest tests/k8s -k sweep_base"
    )
    assert all("namespace" not in o["metadata"] for o in objs)


def test_dump_writes_the_spec_as_a_literal_block_and_round_trips():
    text = dump_manifests(list(_render()))
    assert "spec.yaml: |" in text
    assert list(yaml.safe_load_all(text)) == list(_render())


# ---- names ---------------------------------------------------------------------------------------


def _is_rayjob_name(name: str) -> bool:
    return len(name) <= 47 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) is not None


def test_a_valid_short_name_is_kept():
    assert rayjob_name("shakespeare-char") == "shakespeare-char"
    assert rayjob_name("a" * 47) == "a" * 47


@pytest.mark.parametrize(
    "name",
    [
        "a" * 48,
        "wikitext-2-raw.llama-3-layers.d256.ctx256.bs4-to-bs512.seeds012",  # 63 characters
        "Shakespeare_char",
        "9-lives",
        "x.y",
        "trailing-",
        "A" * 63,
        "0" * 63,
    ],
)
def test_other_names_become_stable_dns1035_labels_with_a_hash(name):
    out = rayjob_name(name)
    assert _is_rayjob_name(out), out
    assert out == rayjob_name(name)  # stable
    assert re.search(r"-[0-9a-f]{8}$", out)


def test_names_that_clean_up_alike_still_differ():
    long_a = "sweep-over-wikitext-with-a-very-long-common-prefix-variant-a"
    long_b = "sweep-over-wikitext-with-a-very-long-common-prefix-variant-b"
    assert rayjob_name(long_a) != rayjob_name(long_b)
    assert rayjob_name("my_sweep") != rayjob_name("my.sweep") != rayjob_name("My-sweep")
    assert rayjob_name("my_sweep").startswith("my-sweep-")


def test_a_long_name_renders_an_operator_valid_rayjob():
    name = "wikitext-2-raw.llama-3-layers.d256.ctx256.bs4-to-bs512.seeds012"
    assert len(name) == 63
    cm, rj = render_rayjob(_spec(name=name), EXAMPLE_TEXT, IMAGE, "critbatch")
    assert _is_rayjob_name(rj["metadata"]["name"])
    assert rj["metadata"]["annotations"]["critbatch.io/sweep-name"] == name
    assert f"--sweep-id {rj['metadata']['name']} " in rj["spec"]["entrypoint"]
    assert cm["metadata"]["name"] == f"{rj['metadata']['name']}-spec"
    assert validate_objects([cm, rj], references=False) == []


# ---- sizing and deadline ------------------------------------------------------------------------


def test_example_pod_size():
    # 1 worker x 1 CPU + 0.01 CPU for the trial's Tune driver = 1.01 -> 2 whole CPUs; 2 trials at once
    assert trial_pod_resources(EXAMPLE) == TrialPodResources(cpus=2, gpus=0, memory_gib=4, replicas=2)


def test_gpu_pod_size_by_hand():
    spec = _spec(
        search={"batch_sizes_sequences": [4, 8, 16]},
        resources={
            "workers_per_trial": 2,
            "cpus_per_worker": 4,
            "gpus_per_worker": 1,
            "trial_driver_cpus": 0.5,
            "max_concurrent_trials": 3,
        },
    )
    # 2 x 4 + 0.5 = 8.5 -> 9 CPUs; 2 x 1 = 2 GPUs; 2 x 9 + 8 x 2 = 34 GiB; 3 trials at once
    assert trial_pod_resources(spec) == TrialPodResources(cpus=9, gpus=2, memory_gib=34, replicas=3)
    _, rj = render_rayjob(spec, EXAMPLE_TEXT, IMAGE, None)
    (c,) = rj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    assert c["resources"]["limits"] == {"cpu": "9", "memory": "34Gi", "nvidia.com/gpu": "2"}
    assert c["resources"]["requests"] == c["resources"]["limits"]
    assert validate_objects([rj], references=False) == []


def test_fractional_gpus_round_up_and_exact_cpus_do_not():
    spec = _spec(resources={"cpus_per_worker": 0.99, "gpus_per_worker": 0.5, "trial_driver_cpus": 0.01})
    pod = trial_pod_resources(spec)
    assert (pod.cpus, pod.gpus) == (1, 1)


def test_worker_pods_never_outnumber_the_trials():
    spec = _spec(
        search={"batch_sizes_sequences": [8, 16], "trials_per_batch_size": 1},  # 16: the example's base batch size
        resources={"max_concurrent_trials": 8},
    )
    assert spec.n_trials == 2
    assert trial_pod_resources(spec).replicas == 2


def test_deadline_follows_the_wall_clock_budget():
    assert active_deadline_s(_spec(budget={"wall_clock_s": 3600.5})) == 3601 + 1800
    # the spec bounds the budget at 90 days, well inside the field's int32
    assert active_deadline_s(_spec(budget={"wall_clock_s": 90 * 86400})) == 90 * 86400 + 1800 < 2**31 - 1
    with pytest.raises(SpecError, match="wall_clock_s"):
        _spec(budget={"wall_clock_s": 1e12})
    _, rj = render_rayjob(_spec(budget={"wall_clock_s": 7200}), EXAMPLE_TEXT, IMAGE, None)
    assert rj["spec"]["activeDeadlineSeconds"] == 9000
    assert defaulted(rj)["spec"]["activeDeadlineSeconds"] == 9000


# ---- arguments -----------------------------------------------------------------------------------


def test_no_namespace_leaves_it_out():
    cm, rj = render_rayjob(EXAMPLE, EXAMPLE_TEXT, IMAGE, None)
    assert "namespace" not in cm["metadata"] and "namespace" not in rj["metadata"]


@pytest.mark.parametrize(
    ("image", "namespace"), [("", "critbatch"), ("a b", "critbatch"), (IMAGE, "Bad_NS"), (IMAGE, "x" * 64)]
)
def test_bad_image_or_namespace_is_invalid_input(image, namespace):
    with pytest.raises(InvalidInput):
        render_rayjob(EXAMPLE, EXAMPLE_TEXT, image, namespace)


# ---- the command line ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli():
    from critbatch.main import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["k8s", "render", *map(str, args)])


def test_cli_prints_the_rendered_manifests(cli):
    result = cli(EXAMPLE_SPEC, "--image", IMAGE, "--namespace", "team-a")
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert docs == render_rayjob(EXAMPLE, EXAMPLE_TEXT, IMAGE, "team-a")


def test_cli_defaults_to_the_critbatch_namespace_and_can_leave_it_out(cli):
    default = [d for d in yaml.safe_load_all(cli(EXAMPLE_SPEC).stdout) if d]
    assert {d["metadata"]["namespace"] for d in default} == {"critbatch"}
    assert default[1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
        "image"
    ].startswith("critbatch:")
    bare = [d for d in yaml.safe_load_all(cli(EXAMPLE_SPEC, "--namespace", "").stdout) if d]
    assert all("namespace" not in d["metadata"] for d in bare)


def test_cli_invalid_spec_exits_2_naming_the_fields(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\ndata: {path: a.txt}\nbudget_tokens: 100\n"
        "search: {batch_sizes_sequences: [0], base_lr: 1, base_batch_size_sequences: 1}\n"
    )
    result = cli(bad)
    assert result.exit_code == 2
    assert "search.batch_sizes_sequences.0" in result.stderr
    assert result.stdout == ""


def test_cli_missing_file_and_bad_namespace_exit_2(cli, tmp_path):
    assert cli(tmp_path / "nope.yaml").exit_code == 2
    result = cli(EXAMPLE_SPEC, "--namespace", "Bad_NS")
    assert result.exit_code == 2 and "--namespace" in result.stderr


def test_the_head_has_room_for_each_trial_runners_host_and_controller():
    """Each trial runner's host actor and Ray Train controller take no CPU, so they run on the head
    beside the driver: 6 GiB plus 1 GiB per runner (as many as trials run at once, never more than the trials)."""
    from sweeps.remote.k8s import head_memory_gib

    def head(spec):
        rj = render_rayjob(spec, EXAMPLE_TEXT, "critbatch:0.1.0", None)[1]
        (c,) = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
        return c["resources"]

    assert head_memory_gib(EXAMPLE) == 8 and head(EXAMPLE)["limits"]["memory"] == "8Gi"  # 2 at a time
    wide = EXAMPLE.model_copy(update={"resources": EXAMPLE.resources.model_copy(update={"max_concurrent_trials": 8})})
    assert head(wide)["requests"] == head(wide)["limits"] == {"cpu": "2", "memory": "14Gi"}
    few = wide.model_copy(
        update={
            "search": wide.search.model_copy(
                update={"batch_sizes_sequences": [4, 8], "trials_per_batch_size": 1, "precision": None}
            )
        }
    )
    assert head_memory_gib(few) == 6 + 2  # two trials in all: two runners


# ---- what outlives the cluster: the Optuna studies -----------------------------------------------------


def _pods(rj):
    cluster = rj["spec"]["rayClusterSpec"]
    return {
        "head": cluster["headGroupSpec"]["template"]["spec"],
        "worker": cluster["workerGroupSpecs"][0]["template"]["spec"],
        "submitter": rj["spec"]["submitterPodTemplate"]["spec"],
    }


def _env(pod):
    (c,) = pod["containers"]
    return {e["name"]: e for e in c["env"]}


def test_the_head_reads_the_optuna_storage_from_the_platforms_secret(monkeypatch):
    """The driver (on the head) keeps its studies where a retried RayJob's new cluster finds them again: the URL
    comes from a Secret key, never from the manifest, and the variable is the one the driver reads."""
    objs = list(_render())
    pods = _pods(objs[1])
    entry = _env(pods["head"])["CRITBATCH_OPTUNA_STORAGE"]
    assert entry == {
        "name": "CRITBATCH_OPTUNA_STORAGE",
        "valueFrom": {"secretKeyRef": {"name": "critbatch-optuna", "key": "url"}},
    }
    assert OPTUNA_STORAGE_SECRET == SecretKeyRef(name="critbatch-optuna", key="url")
    # trial code on the workers, and the submitter, get no database credentials
    assert "CRITBATCH_OPTUNA_STORAGE" not in _env(pods["worker"]) | _env(pods["submitter"])
    assert validate_objects(objs, references=False) == []
    platform = render("overlays/example")  # it holds Secret critbatch-optuna with key url
    assert reference_problems(platform + objs, complete=True) == []
    without = [o for o in platform if o["metadata"]["name"] != "critbatch-optuna"]
    assert any("'critbatch-optuna' is not in the render" in p for p in reference_problems(without + objs))
    from sweeps.store.state import optuna_storage_url

    monkeypatch.setenv("CRITBATCH_OPTUNA_STORAGE", "postgresql+psycopg2://u:p@critbatch-postgres:5432/optuna")
    assert optuna_storage_url(K8S) == "postgresql+psycopg2://u:p@critbatch-postgres:5432/optuna"


def test_the_optuna_secret_can_be_another_or_none():
    other = SecretKeyRef(name="team-db.optuna", key="optuna_url")
    _, rj = render_rayjob(EXAMPLE, EXAMPLE_TEXT, IMAGE, None, optuna_storage=other)
    ref = _env(_pods(rj)["head"])["CRITBATCH_OPTUNA_STORAGE"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "team-db.optuna", "key": "optuna_url"}
    _, bare = render_rayjob(EXAMPLE, EXAMPLE_TEXT, IMAGE, None, optuna_storage=None)
    assert "CRITBATCH_OPTUNA_STORAGE" not in _env(_pods(bare)["head"])  # sqlite on the head's disk, as before
    assert validate_objects([rj], references=False) == validate_objects([bare], references=False) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("critbatch-optuna", SecretKeyRef(name="critbatch-optuna", key="url")),
        ("db:optuna.url", SecretKeyRef(name="db", key="optuna.url")),
        ("", None),
    ],
)
def test_secret_key_refs_parse(text, expected):
    assert parse_secret_key_ref(text, option="--optuna-storage-secret") == expected


@pytest.mark.parametrize("text", ["Critbatch_Optuna", "db:has space", "db:..", "x" * 254, ":url"])
def test_bad_secret_key_refs_name_the_option(text):
    with pytest.raises(InvalidInput, match="--optuna-storage-secret"):
        parse_secret_key_ref(text, option="--optuna-storage-secret")


# ---- the cluster is deleted however the deployment ends --------------------------------------------------


def test_the_cluster_is_deleted_however_the_deployment_ends():
    """KubeRay >= 1.5's deletionRules keyed on jobStatus leak the cluster when activeDeadlineSeconds fails the
    deployment while the Ray job is still RUNNING (kuberay#5184). The rendered RayJob uses shutdownAfterJobFinishes,
    which KubeRay applies to every Complete or Failed deployment, whatever the job status."""
    for queue in (None, "team-a"):
        _, rj = render_rayjob(EXAMPLE, EXAMPLE_TEXT, IMAGE, "critbatch", queue_name=queue)
        rj = defaulted(rj)
        assert rj["spec"]["activeDeadlineSeconds"] > 0 and "deletionStrategy" not in rj["spec"]
        for deployment, job in ENDINGS:
            assert cluster_deleted_when_ended(rj, deployment, job), (queue, deployment, job)


def _with_deletion_rules(rj, *conditions):
    out = defaulted(rj)
    del out["spec"]["shutdownAfterJobFinishes"], out["spec"]["ttlSecondsAfterFinished"]
    out["spec"]["deletionStrategy"] = {
        "deletionRules": [{"condition": {**c, "ttlSeconds": 300}, "policy": "DeleteCluster"} for c in conditions]
    }
    return out


def test_deletion_rules_need_a_deployment_failed_rule_and_cannot_have_kueue():
    """Why the renderer keeps shutdownAfterJobFinishes: the KubeRay v1.7.0 model of kuberay#5184, and its fix."""
    _, rj = _render()
    by_status = _with_deletion_rules(rj, {"jobStatus": "SUCCEEDED"}, {"jobStatus": "FAILED"})
    assert validate_objects([by_status], references=False) == []  # KubeRay accepts it ...
    assert not cluster_deleted_when_ended(by_status, "Failed", "RUNNING")  # ... and keeps the cluster forever
    covered = _with_deletion_rules(rj, {"jobStatus": "SUCCEEDED"}, {"jobDeploymentStatus": "Failed"})
    assert validate_objects([covered], references=False) == []
    left = [(d, j) for d, j in ENDINGS if not cluster_deleted_when_ended(covered, d, j)]
    assert left == [("Complete", "STOPPED")]  # a stopped Ray job: no rule can name it (jobStatus SUCCEEDED or FAILED)
    stopped = _with_deletion_rules(rj, {"jobStatus": "STOPPED"})
    assert any("'STOPPED' is not one of" in p for p in validate_objects([stopped], references=False))
    # deletionRules exclude shutdownAfterJobFinishes, which a suspended (Kueue-admitted) RayJob needs
    covered["spec"]["suspend"] = True
    assert any("suspend needs shutdownAfterJobFinishes" in p for p in validate_objects([covered], references=False))
    covered["spec"]["shutdownAfterJobFinishes"] = True
    assert any("mutually exclusive" in p for p in validate_objects([covered], references=False))


# ---- a Kueue queue ------------------------------------------------------------------------------------------


def _kueue_rayjob_problems(rj: dict) -> list[str]:
    """Kueue's admission checks of a queued RayJob (pkg/controller/jobs/rayjob/rayjob_webhook.go and
    raycluster/raycluster_webhook.go, validateCreate): its own cluster, deleted at the end, no autoscaler,
    at most 7 worker groups, none named "head"."""
    spec, out = rj["spec"], []
    if spec.get("clusterSelector") or not spec.get("rayClusterSpec"):
        out.append("a Kueue-managed RayJob brings its own rayClusterSpec")
    if not spec.get("shutdownAfterJobFinishes"):
        out.append("a Kueue-managed RayJob deletes its cluster at the end")
    cluster = spec.get("rayClusterSpec") or {}
    if cluster.get("enableInTreeAutoscaling"):
        out.append("a Kueue-managed RayJob has no autoscaler")
    groups = cluster.get("workerGroupSpecs") or []
    if len(groups) > 7 or any(g.get("groupName") == "head" for g in groups):
        out.append("at most 7 worker groups, none named head")
    return out


def test_a_queue_name_labels_the_rayjob_for_kueue():
    cm, rj = render_rayjob(EXAMPLE, EXAMPLE_TEXT, IMAGE, "critbatch", queue_name="team-a.gpu")
    assert rj["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a.gpu"
    # only the RayJob is queued: not its ConfigMap, nor its pods (Kueue admits the RayJob as one workload)
    assert KUEUE_QUEUE_LABEL not in cm["metadata"]["labels"]
    assert all(
        KUEUE_QUEUE_LABEL not in pod_labels
        for pod_labels in (
            rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["labels"],
            rj["spec"]["submitterPodTemplate"]["metadata"]["labels"],
        )
    )
    # Kueue's webhook suspends it on creation until admitted; the manifest does not, so that a namespace Kueue does
    # not manage still runs it
    assert "suspend" not in rj["spec"]
    assert validate_objects([cm, rj], references=False) == [] and _kueue_rayjob_problems(rj) == []
    suspended = copy.deepcopy(rj)
    suspended["spec"]["suspend"] = True  # what Kueue's webhook stores
    assert validate_objects([suspended], references=False) == []
    _, plain = _render()
    assert KUEUE_QUEUE_LABEL not in plain["metadata"]["labels"]


@pytest.mark.parametrize("queue", ["", "Team_A", "a" * 64, "-a", "a b"])
def test_a_bad_queue_name_is_invalid_input(queue):
    with pytest.raises(InvalidInput, match="--queue-name"):
        render_rayjob(EXAMPLE, EXAMPLE_TEXT, IMAGE, None, queue_name=queue)


def test_cli_queue_name_and_optuna_secret(cli):
    def docs(*args):
        result = cli(EXAMPLE_SPEC, "--image", IMAGE, *args)
        assert result.exit_code == 0, result.output
        return [d for d in yaml.safe_load_all(result.stdout) if d]

    assert docs() == render_rayjob(EXAMPLE, EXAMPLE_TEXT, IMAGE, "critbatch")  # the defaults are the renderer's
    assert docs("--queue-name", "team-a") == render_rayjob(
        EXAMPLE, EXAMPLE_TEXT, IMAGE, "critbatch", queue_name="team-a"
    )
    assert docs("--queue-name", "") == render_rayjob(EXAMPLE, EXAMPLE_TEXT, IMAGE, "critbatch")
    assert docs("--optuna-storage-secret", "db:u") == render_rayjob(
        EXAMPLE, EXAMPLE_TEXT, IMAGE, "critbatch", optuna_storage=SecretKeyRef(name="db", key="u")
    )
    assert docs("--optuna-storage-secret", "") == render_rayjob(
        EXAMPLE, EXAMPLE_TEXT, IMAGE, "critbatch", optuna_storage=None
    )
    for args, option in (
        (["--queue-name", "Team_A"], "--queue-name"),
        (["--optuna-storage-secret", "Bad_Secret"], "--optuna-storage-secret"),
    ):
        result = cli(EXAMPLE_SPEC, *args)
        assert result.exit_code == 2 and option in result.stderr and result.stdout == ""
