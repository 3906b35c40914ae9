"""``critbatch k8s``: Kubernetes manifests for a sweep (attached by ``critbatch.main._register_commands``)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import typer

__all__ = ["register"]


def _default_image() -> str:
    try:
        return f"critbatch:{metadata.version('critbatch')}"
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "critbatch:latest"


def _spec_text(spec: Path) -> str:
    """The spec file's text as the cluster gets it: a derived spec (one with ``base:``) resolved,
    since the cluster has no base file.

    Raises:
        SpecError: the file is missing or unreadable, or its base cannot be resolved.
    """
    import yaml

    from sweeps.spec import read_spec_text, resolved_spec_dict

    text = read_spec_text(spec)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return text  # parse_spec_text reports it
    if isinstance(data, dict) and "base" in data:
        return yaml.safe_dump(resolved_spec_dict(spec), sort_keys=False)
    return text


def register(app: typer.Typer) -> None:
    """Add the ``k8s`` command group (``critbatch k8s render``) to the ``critbatch`` app."""
    k8s = typer.Typer(
        help="Kubernetes manifests (KubeRay) for a sweep.\n\nSee docs/kubernetes.md.",
        no_args_is_help=True,
        rich_markup_mode=None,  # click's plain help, as the main app's
    )

    @k8s.command("render")
    def render(
        spec: Path = typer.Argument(..., help="sweep spec (YAML)"),
        image: str = typer.Option(_default_image(), "--image", help="critbatch container image"),
        namespace: str | None = typer.Option(
            "critbatch", "--namespace", "-n", help="namespace of the critbatch platform (k8s/base); '' leaves it out"
        ),
        optuna_storage_secret: str = typer.Option(
            "critbatch-optuna:url",
            "--optuna-storage-secret",
            metavar="SECRET[:KEY]",
            help="Secret key holding the Optuna study storage URL (an RDB that outlives the cluster), set as "
            "CRITBATCH_OPTUNA_STORAGE on the Ray head; '' keeps the studies on the head's disk, which a "
            "retried job does not find",
        ),
        queue_name: str | None = typer.Option(
            None,
            "--queue-name",
            help="Kueue LocalQueue to wait in: the RayJob gets the label kueue.x-k8s.io/queue-name=NAME",
        ),
    ) -> None:
        """Print a sweep's ConfigMap and KubeRay RayJob as YAML.

        The ConfigMap holds the spec, the RayJob runs the sweep; pipe it to `kubectl apply -f -`.
        """
        from critbatch.common import fail_invalid as _fail_invalid
        from sweeps.errors import InvalidInput
        from sweeps.remote.k8s import dump_manifests, image_data_warnings, parse_secret_key_ref, render_rayjob
        from sweeps.spec import parse_spec_text

        try:
            text = _spec_text(spec)
            parsed = parse_spec_text(text)
            optuna_storage = parse_secret_key_ref(optuna_storage_secret, option="--optuna-storage-secret")
            objects = render_rayjob(
                parsed, text, image, namespace or None, optuna_storage=optuna_storage, queue_name=queue_name or None
            )
        except InvalidInput as exc:  # a SpecError is an InvalidInput
            _fail_invalid(exc)
        for warning in image_data_warnings(parsed):  # stderr: stdout stays the manifests, for kubectl apply
            typer.echo(f"warning: {warning}", err=True)
        typer.echo(dump_manifests(objects), nl=False)

    app.add_typer(k8s, name="k8s")
