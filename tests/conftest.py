"""Shared fixtures: the repo root, tiny specs, and a working directory at the repo root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "specs" / "tiny.yaml"


@pytest.fixture
def repo_root(monkeypatch) -> Path:
    monkeypatch.chdir(ROOT)
    return ROOT


@pytest.fixture
def tiny_spec_dict() -> dict:
    d = yaml.safe_load(TINY.read_text())
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    return d


def write_spec(tmp_path: Path, d: dict, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d))
    return p


os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
