"""The README's one-minute tour runs as written, in a fresh folder, and prints what the README shows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def _tour_blocks() -> list[tuple[str, str]]:
    """The tour section's fenced blocks, in order, as ``(language, text)``."""
    section = README.split("## A one-minute tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.DOTALL)


def test_the_one_minute_tour_prints_what_the_readme_shows(tmp_path):
    """Each bash block of the tour, run by bash in an empty folder holding only the bundled data (as a
    fresh clone has it), with the venv's scripts on PATH: the analyze JSON holds the numbers the README
    quotes, its stderr's first line and the plan's two lines are the README's text blocks, and every file
    lands under out/ (which git ignores), none beside it."""
    (tmp_path / "data").symlink_to(ROOT / "data")
    blocks = _tour_blocks()
    bash = [b for lang, b in blocks if lang == "bash"]
    texts = [b for lang, b in blocks if lang == "text"]
    assert len(bash) == 2 and len(texts) == 2
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    results = []
    for block in bash:
        script = "\n".join(line for line in block.splitlines() if not line.startswith("source "))
        r = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        results.append(r)
    fit = json.loads((tmp_path / "out" / "zhang_85M.json").read_text())
    assert round(fit["b_crit"], 1) == 2190.6 and fit["status"] == "ok" and round(fit["cbs_20"], 1) == 745.3
    assert [round(x, 1) for x in fit["b_crit_ci"]] == [1902.0, 2529.0]
    assert results[0].stderr.splitlines()[0] == texts[0].splitlines()[0]
    printed = results[1].stdout.splitlines() + results[1].stderr.splitlines()
    assert [line for line in texts[1].strip().splitlines() if line not in printed] == [], printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out"]
