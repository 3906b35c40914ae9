"""``critbatch --help`` of the app and of every command, rendered at 80 columns as a new
user's terminal shows it: nothing cut (every option's full name, every help text whole, no
ellipsis), ``-h`` the same as ``--help``, the exit codes listed, and ``critbatch --version``."""

from __future__ import annotations

import re
import signal
from importlib import metadata
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from critbatch import common as cli_common
from critbatch.main import app

WIDTH = 80
ENV = {"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)}


def _commands() -> list[tuple[tuple[str, ...], Any]]:
    """The app and every command under it, by the words that name it (``("k8s", "render")``).

    Typer's commands are its own vendored click's, so groups and options are told by their attributes.
    """
    found: list[tuple[tuple[str, ...], Any]] = []

    def walk(words: tuple[str, ...], cmd: Any) -> None:
        found.append((words, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(words + (name,), sub)

    walk((), typer.main.get_command(app))
    return found


COMMANDS = _commands()


def _help(words: tuple[str, ...], flag: str = "--help") -> str:
    r = CliRunner().invoke(app, [*words, flag], env=ENV)
    assert r.exit_code == 0, r.output
    return r.output


def _squashed(text: str) -> str:
    """``text`` without whitespace: a help text wrapped over lines (or broken at a hyphen) still matches."""
    return "".join(text.split())


def _options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]


def test_every_command_and_option_is_covered():
    names = {" ".join(w): cmd for w, cmd in COMMANDS}
    assert {"", "validate", "run", "resume", "analyze", "submit", "plan", "k8s", "k8s render"} <= set(names), names
    plan_options = {o for p in _options(names["plan"]) for o in p.opts}
    assert {"--tokens-per-sequence", "--grad-bytes-per-param", "--sync-every-steps"} <= plan_options, plan_options


@pytest.mark.parametrize("words,cmd", COMMANDS, ids=[" ".join(w) or "critbatch" for w, _ in COMMANDS])
def test_help_at_80_columns_cuts_nothing(words, cmd):
    out = _help(words)
    assert _help(words, "-h") == out  # -h is --help on every command
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, out
    assert "…" not in out, out
    for line in lines:
        if not line.startswith("Usage:"):  # the usage's "[ARGS]..." is click's, not a cut
            assert not line.rstrip().endswith("..."), (line, out)
    flat = _squashed(out)
    if cmd.help:
        assert _squashed(cmd.help.replace("\b", "")) in flat, out
    for param in _options(cmd):
        for name in param.opts + param.secondary_opts:
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", out), (name, out)
    for param in cmd.params:
        if getattr(param, "help", None) and not getattr(param, "hidden", False):
            assert _squashed(param.help) in flat, (param.name, out)
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            short = sub.get_short_help_str(limit=1000)
            assert re.search(rf"^  {re.escape(name)}\s+{re.escape(short)}$", out, re.MULTILINE), (name, short, out)


def test_the_main_help_lists_the_exit_codes():
    out = _help(())
    epilog = out[out.index("Exit codes:") :]
    assert cli_common.EXIT_FAILED == 1 and cli_common.EXIT_INVALID == 2  # every command module exits with these
    for code, text in [
        (0, "success"),
        (1, "the sweep ran but failed"),
        (2, "invalid input: a bad spec, a missing file"),
        (128 + signal.SIGINT, "stopped by Ctrl-C (SIGINT); `critbatch resume OUT` continues it"),
        (128 + signal.SIGTERM, "stopped by SIGTERM; `critbatch resume OUT` continues it"),
    ]:
        assert re.search(rf"^\s+{code}\s+{re.escape(text)}", epilog, re.MULTILINE), (code, epilog)
    assert [int(c) for c in re.findall(r"^\s{4}(\d+)\s", epilog, re.MULTILINE)] == [0, 1, 2, 130, 143], epilog


def test_version_prints_the_installed_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output == f"critbatch {metadata.version('critbatch')}\n", r.output
    assert metadata.version("critbatch")  # the package is installed (pyproject.toml's version)
