"""The Dockerfile and the manifests agree: versions, targets, and what the image contains."""

from __future__ import annotations

import re
from importlib import metadata

from k8s_fixtures import ROOT, kustomizations, render
from k8s_validate import pod_specs

from sweeps.remote.k8s import RAY_VERSION

DOCKERFILE = (ROOT / "Dockerfile").read_text()
DOCKERIGNORE = (ROOT / ".dockerignore").read_text().splitlines()


def _arg(name: str) -> str:
    (value,) = re.findall(rf"^ARG {name}=(\S+)$", DOCKERFILE, flags=re.MULTILINE)
    return value


def _images() -> set[str]:
    return {
        c["image"]
        for rel in kustomizations()
        for obj in render(rel)
        for _, pod in pod_specs(obj)
        for group in ("initContainers", "containers")
        for c in pod.get(group) or []
    }


def test_ray_version_of_the_manifests_is_the_installed_one():
    assert metadata.version("ray") == RAY_VERSION
    checked = set()
    for rel in kustomizations():
        for obj in render(rel):
            spec = obj.get("spec", {})
            cluster = spec.get("rayClusterSpec", spec) if obj["kind"] in ("RayJob", "RayCluster") else {}
            if cluster:
                assert cluster["rayVersion"] == RAY_VERSION, f"{rel}: {obj['metadata']['name']}"
                checked.add(obj["kind"])
    assert checked == {"RayJob", "RayCluster"}  # both kinds were found and checked, not skipped


def test_cpu_torch_is_installed_before_the_project():
    assert _arg("TORCH_VERSION") == "2.13.0"
    assert _arg("TORCH_INDEX_URL").endswith("/whl/cpu")
    torch_at = DOCKERFILE.index('pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"')
    assert torch_at < DOCKERFILE.index('RUN pip install -c constraints.txt ".[sweep,service]" ')


def test_the_image_installs_the_locked_versions():
    """The image installs what the suite passed with (constraints.txt, as `make install` does), and the
    versions the Dockerfile names itself agree with the lock."""
    assert 'RUN pip install -c constraints.txt ".[sweep,service]" ' in DOCKERFILE
    lock = dict(
        line.split("==", 1)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert lock["torch"] == _arg("TORCH_VERSION") and lock["mlflow"] == _arg("MLFLOW_VERSION")


def test_default_target_is_critbatch_and_mlflow_target_matches_its_image_tag():
    stages = re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE, flags=re.MULTILINE)
    assert stages[-1] == "critbatch" and "mlflow" in stages
    mlflow_images = {i for i in _images() if "critbatch-mlflow" in i}
    assert mlflow_images and all(i.endswith(f":{_arg('MLFLOW_VERSION')}") for i in mlflow_images)


def test_everything_copied_exists_and_is_not_docker_ignored():
    copied = [p for line in re.findall(r"^COPY (.+) \S+$", DOCKERFILE, flags=re.MULTILINE) for p in line.split()]
    for path in copied:
        if path.endswith("*"):
            continue  # optional (README.md*)
        assert (ROOT / path).exists(), path
        assert path not in DOCKERIGNORE, path
    for needed in ("critbatch", "sweeps", "workloads", "service", "data", "pyproject.toml"):
        assert needed in copied and needed not in DOCKERIGNORE
    assert ".venv" in DOCKERIGNORE and ".git" in DOCKERIGNORE


def test_image_runs_as_the_uid_the_pods_expect():
    assert DOCKERFILE.rstrip().splitlines()[-1].startswith("CMD")
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, flags=re.MULTILINE)
    assert users and all(u == "1000:1000" for u in users)
    checked = set()
    for rel in kustomizations():
        for obj in render(rel):
            for _, pod in pod_specs(obj):
                image = pod["containers"][0]["image"]
                if "critbatch" in image.rsplit("/", 1)[-1]:
                    assert pod["securityContext"]["runAsUser"] == 1000, image
                    checked.add(image.rsplit("/", 1)[-1].split(":")[0])
    assert checked == {"critbatch", "critbatch-mlflow"}  # pods of both images were found and checked
