"""What the ``critbatch`` image carries, for the manifests of :mod:`sweeps.remote.k8s`: its working
directory, and which of a spec's local inputs it leaves out (``.dockerignore``, or an absolute path
outside the working directory), so that ``critbatch k8s render`` can warn before the job fails in the pod.

Plain data: reads the repository's ``.dockerignore``, imports neither Ray nor Kubernetes.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from sweeps.spec import SweepSpec

__all__ = ["DOCKERIGNORE", "WORKDIR", "ignore_patterns", "image_data_warnings"]

WORKDIR = "/app"  # the image's working directory: relative data paths in specs resolve here

#: The build context's ignore file: what it excludes is not in the image (``Dockerfile`` copies the repo).
DOCKERIGNORE = Path(__file__).resolve().parents[2] / ".dockerignore"


def ignore_patterns(path: Path = DOCKERIGNORE) -> list[str]:
    """The patterns of ``path`` (a ``.dockerignore``) that exclude something: no comments, no ``!`` exceptions;
    none if it does not exist."""
    if not path.is_file():
        return []
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith(("#", "!"))]


def image_data_warnings(spec: SweepSpec, patterns: list[str] | None = None) -> list[str]:
    """One sentence per local input of ``spec`` that the pod will not find: a relative path (resolved
    in the image's ``/app``) whose file or a folder above it matches a ``.dockerignore`` pattern
    (``out*`` excludes ``out/wikitext-2-bpe``), or an absolute path outside ``/app``. URIs
    (``s3://``...) are fetched in the pod and never warned about.
    """
    patterns = ignore_patterns() if patterns is None else patterns
    inputs = {
        "data.path": spec.data.path,
        "data.shards": spec.data.shards,
        "data.tokenizer": None if spec.data.tokenizer == "byte" else spec.data.tokenizer,
        "finetune.checkpoint_dir": spec.finetune.checkpoint_dir if spec.finetune is not None else None,
    }
    fix = (
        "use an fsspec URI (s3://...), mount a volume at that path in the RayJob's pods, or build an image "
        "that carries it"
    )
    out = []
    for field, value in inputs.items():
        if not value or "://" in value:
            continue
        p = Path(value)
        if p.is_absolute():
            if not str(p).startswith(WORKDIR + "/"):
                out.append(
                    f"{field}: {value} is an absolute path outside the image's {WORKDIR}: the job will not "
                    f"find it in the pod; {fix}"
                )
            continue
        parts = Path(*[x for x in p.parts if x != "."]).parts
        hit = next(
            (
                (pat, "/".join(parts[: i + 1]))
                for i in range(len(parts))
                for pat in patterns
                if fnmatch.fnmatch("/".join(parts[: i + 1]), pat.rstrip("/"))
                or fnmatch.fnmatch(parts[i], pat.rstrip("/"))
            ),
            None,
        )
        if hit is not None:
            out.append(
                f"{field}: {value} is excluded from the image by .dockerignore ({hit[0]!r} matches {hit[1]}): "
                f"the job will not find it in the pod; {fix}"
            )
    return out
