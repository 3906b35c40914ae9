"""docs/kubernetes.md names only things that exist, and its commands fit the manifests."""

from __future__ import annotations

import re

from k8s_fixtures import K8S, ROOT, render

from sweeps.remote.k8s import rayjob_name

DOC = (ROOT / "docs" / "kubernetes.md").read_text()
CODE = "\n".join(re.findall(r"```bash\n(.*?)```", DOC, flags=re.DOTALL))


def test_paths_in_the_doc_exist():
    paths = set(re.findall(r"\bk8s/[\w./-]+", DOC)) - {"k8s/overlays/mycluster"}
    paths = {p.rstrip(".") for p in paths if "mycluster" not in p}
    assert paths
    for p in paths:
        assert (ROOT / p).exists(), p
    assert (K8S / "overlays" / "example" / "../../rbac-sweep-submitter").resolve().is_dir()


def test_objects_the_doc_names_are_in_the_example_platform():
    objs = render("overlays/example")
    have = {(o["kind"].lower(), o["metadata"]["name"]) for o in objs}
    aliases = {"svc": "service", "deploy": "deployment"}
    named = re.findall(r"\b(job|deployment|svc|statefulset|raycluster|secret)/(critbatch[\w-]*)", CODE)
    named += [
        (k.lower(), n)
        for k, n in re.findall(
            r"`(StatefulSet|Job|Deployment|Service|RayCluster|ServiceAccount)/(critbatch[\w-]*)", DOC
        )
    ]
    assert len(named) > 8
    for kind, name in named:
        assert (aliases.get(kind, kind), name) in have, f"{kind}/{name}"
    others = re.findall(r"(get raycluster|port-forward svc/)\s*([\w-]+)", CODE)
    assert len(others) == 3
    for verb, name in others:
        assert ("raycluster" if "raycluster" in verb else "service", name) in have, name


def test_secret_commands_write_every_key_the_platform_needs():
    written: dict[str, set[str]] = {}
    for line in re.findall(r"^printf '(.*?)' .*> ([\w-]+)\.env$", CODE, flags=re.MULTILINE):
        keys = set(re.findall(r"(?:^|\\n)(\w+)=", line[0]))
        written[line[1]] = keys
    example = {p.stem: p for p in (K8S / "overlays" / "example" / "secrets").glob("*.env")}
    assert set(written) == set(example)
    required = {
        o["metadata"]["name"]: set(o["metadata"]["annotations"]["critbatch.io/required-keys"].split(","))
        for o in render("base")
        if o["kind"] == "Secret"
    }
    assert sorted(map(sorted, written.values())) == sorted(map(sorted, required.values()))


def test_name_example_and_image_tags_are_current():
    src, dst = re.search(r"`(\w+)` -> `([\w-]+)`", DOC).groups()
    assert rayjob_name(src) == dst
    dockerfile = (ROOT / "Dockerfile").read_text()
    (mlflow_version,) = re.findall(r"^ARG MLFLOW_VERSION=(\S+)$", dockerfile, flags=re.MULTILINE)
    assert f"critbatch-mlflow:{mlflow_version}" in CODE
    for image in re.findall(r"`((?:docker\.io|quay\.io)/[^`]+)`", DOC):
        assert any(c_image == image for c_image in _all_images()), image


def _all_images() -> set[str]:
    out = set()
    for o in render("base"):
        text = repr(o)
        out.update(re.findall(r"'image': '([^']+)'", text))
    return out
