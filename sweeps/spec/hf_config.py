"""``model.hf_config`` read into its mapping: a path (a JSON file, or a folder's ``config.json``) or an inline
mapping. Plain spec logic: the driver's preflight and the REST service's staging both read it with this."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sweeps.errors import InvalidInput

__all__ = ["read_hf_config"]


def read_hf_config(hf_config: dict[str, Any] | str, *, shown_as: str | None = None) -> dict[str, Any]:
    """``model.hf_config`` as a mapping: an inline one as it is, a path read as JSON (a folder: its
    ``config.json``; relative paths resolve from the working directory).

    Args:
        hf_config: the spec's ``model.hf_config``.
        shown_as: how the messages name the file (a folder's gets ``/config.json``): the path the user gave
            where ``hf_config`` is a copy of it (job staging reads the shipped copy); default its own path.

    Raises:
        InvalidInput: ``model.hf_config: ...``: no such file, not JSON, not a JSON object, no ``model_type``.
    """
    if isinstance(hf_config, dict):
        return dict(hf_config)
    p = Path(hf_config).expanduser()
    if p.is_dir():
        p = p / "config.json"
        shown_as = None if shown_as is None else f"{shown_as.rstrip('/')}/config.json"
    shown = p if shown_as is None else shown_as
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        where = f" (resolved to {p.resolve()})" if shown_as is None else ""
        raise InvalidInput(f"model.hf_config: file not found: {shown_as or hf_config}{where}") from None
    except (OSError, UnicodeDecodeError) as exc:
        detail = exc if shown_as is None else getattr(exc, "strerror", None) or exc  # a copy's path is not the user's
        raise InvalidInput(f"model.hf_config: cannot read {shown}: {detail}") from None
    except ValueError as exc:
        raise InvalidInput(f"model.hf_config: {shown} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str) or not data["model_type"].strip():
        raise InvalidInput(f"model.hf_config: {shown} is not a transformers config (a JSON object with model_type)")
    return data
