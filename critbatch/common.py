"""What every ``critbatch`` command module shares: the consoles (``console`` on stderr for messages,
``out`` on stdout for results), the exit codes and the one way to refuse invalid input."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "console", "fail_invalid", "out"]

console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

EXIT_FAILED = 1
EXIT_INVALID = 2


def fail_invalid(exc: Exception) -> NoReturn:
    """Print ``exc`` on stderr (``error: ...``; a spec with one problem in one line) and exit 2.

    Raises:
        typer.Exit: always, with :data:`EXIT_INVALID`.
    """
    console.print(Text.assemble(("error:", "bold red"), f" {exc}"), highlight=False)
    raise typer.Exit(EXIT_INVALID)
