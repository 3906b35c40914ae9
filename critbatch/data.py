"""``critbatch prepare-data``: tokenize a corpus once into token shards that workers memory-map."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``prepare-data`` command to the ``critbatch`` app."""

    @app.command("prepare-data")
    def prepare_data(
        inputs: list[str] = typer.Argument(
            ..., help="input files or globs (quote them): text, JSON Lines (.jsonl) or Parquet"
        ),
        output: Path = typer.Option(
            ...,
            "--output",
            "-o",
            help="folder for the shards and index.json (a new, empty or earlier prepared folder; replaced atomically)",
        ),
        tokenizer: str = typer.Option(
            "byte", "--tokenizer", help="'byte' or a local Hugging Face (fast) tokenizer folder"
        ),
        text_column: str = typer.Option("text", "--text-column", help="the text field of JSON Lines / Parquet rows"),
        validation_fraction: float = typer.Option(
            0.1, "--validation-fraction", help="held-out fraction of the documents"
        ),
        seed: int = typer.Option(0, "--seed", help="fixes which documents are held out"),
        text_documents: str = typer.Option(
            "file",
            "--text-documents",
            help="text files: 'file' (one document each), "
            "'paragraph' (documents separated by blank lines) or 'line' (a document a line)",
        ),
        num_proc: int | None = typer.Option(None, "--num-proc", min=1, help="tokenizing processes (default: the CPUs)"),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar"),
    ) -> None:
        """Tokenize a corpus once into token shards.

        In parallel, into uint16/uint32 shards and index.json (give the folder as data.shards). The
        held-out split is by documents, drawn by the seed. Re-running on the same inputs is a no-op
        (checksums in the index). Bad input exits 2 and leaves nothing written.
        """
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

        from critbatch.common import console, out
        from critbatch.common import fail_invalid as _fail_invalid
        from workloads.api import DataError
        from workloads.api import prepare_data as prepare

        bar = Progress(
            "tokenizing",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not progress,
            transient=True,
        )
        with bar:
            task = bar.add_task("tokenizing", total=None)
            try:
                res = prepare(
                    list(inputs),
                    output,
                    tokenizer=tokenizer,
                    text_column=text_column,
                    validation_fraction=validation_fraction,
                    seed=seed,
                    text_documents=text_documents,
                    num_proc=num_proc,
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )
            except DataError as exc:
                bar.stop()
                _fail_invalid(exc)
        t = res.index["totals"]
        what = "up to date (nothing written)" if res.up_to_date else "wrote"
        out.print(
            f"{what}: {res.folder}: {t['train']['tokens']} train tokens in {t['train']['documents']} documents, "
            f"{t['validation']['tokens']} validation tokens in {t['validation']['documents']} documents, "
            f"{res.index['dtype']}, vocabulary {res.index['vocab_size']}",
            highlight=False,
        )
