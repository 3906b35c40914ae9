"""sweeps/examples/wikitext-bpe.yaml from a fresh clone, without training: the committed BPE tokenizer
is the one the example names (by hash), `critbatch prepare-data` on the bundled WikiText-2 gives the
shards the example describes, the example validates on them, and wrong inputs are refused by field."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from critbatch.main import app
from tests.conftest import ROOT, write_spec
from workloads.data.prepare import prepare_data, tokenizer_identity
from workloads.data.shards import file_sha256

EXAMPLE = ROOT / "sweeps" / "examples" / "wikitext-bpe.yaml"
WIKI = ROOT / "data" / "wikitext-2-raw"
TOKENIZER = WIKI / "bpe-2048"


def _stated_hashes() -> list[str]:
    """The two SHA-256s in the example's header: tokenizer.json's, then the tokenizer folder's."""
    return re.findall(r"sha256 ([0-9a-f]{64})", EXAMPLE.read_text())


def _prepare_command() -> list[str]:
    """The example header's `critbatch prepare-data ...` command, as arguments after `critbatch`."""
    m = re.search(r"#\s+critbatch (prepare-data .*?)\n#\s+critbatch run", EXAMPLE.read_text(), re.DOTALL)
    return m.group(1).replace("\\\n#", " ").split()


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A working directory laid out like a fresh clone (``data/`` linked in), after the example's
    prepare-data command (run in this process, one tokenizing process)."""
    root = tmp_path_factory.mktemp("clone")
    (root / "data").symlink_to(ROOT / "data")
    args = _prepare_command()
    out = args[args.index("--output") + 1]
    res = prepare_data(
        [str(ROOT / args[1])],
        root / out,
        tokenizer=str(ROOT / args[args.index("--tokenizer") + 1]),
        text_documents=args[args.index("--text-documents") + 1],
        num_proc=1,
    )
    assert not res.up_to_date
    return root


def test_the_committed_tokenizer_is_the_one_the_example_names():
    json_sha, folder_sha = _stated_hashes()
    assert file_sha256(TOKENIZER / "tokenizer.json") == json_sha
    ident = tokenizer_identity(str(TOKENIZER))
    assert ident["sha256"] == folder_sha and ident["vocab_size"] == 2048 and ident["separator"] == [2047]
    assert sorted(p.name for p in TOKENIZER.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]


def test_prepare_data_on_the_bundled_wikitext_gives_the_index_the_example_expects(clone):
    spec = yaml.safe_load(EXAMPLE.read_text())
    index = yaml.safe_load((clone / spec["data"]["shards"] / "index.json").read_text())
    assert index["tokenizer"]["sha256"] == _stated_hashes()[1] and index["vocab_size"] == 2048
    assert index["dtype"] == "uint16" and index["split"] == {
        "method": "documents",
        "seed": 0,
        "validation_fraction": 0.1,
    }
    assert index["inputs"][0]["sha256"] == "4f3e427e4aff23acff917a8a51aeae21bf12832256e26914c8fc250dcef4103c"
    t = index["totals"]
    assert (t["train"]["documents"], t["validation"]["documents"]) == (2602, 289)  # 2,891 lines, 10 % held out
    assert (t["train"]["tokens"], t["validation"]["tokens"]) == (372534, 39749)  # the numbers in the example's header
    assert f"{t['train']['tokens']:,} train and {t['validation']['tokens']:,}" in EXAMPLE.read_text()
    assert spec["budget_tokens"] < t["train"]["tokens"] and spec["eval"]["eval_tokens"] <= t["validation"]["tokens"]


def test_the_example_validates_after_preparing_and_the_readme_shows_both_commands(clone, monkeypatch):
    monkeypatch.chdir(clone)
    r = CliRunner().invoke(app, ["validate", str(EXAMPLE)])
    assert r.exit_code == 0, r.output
    assert "6 batch sizes x 2 trials" in r.output
    readme = (ROOT / "README.md").read_text()
    assert "critbatch " + " ".join(_prepare_command()) in " ".join(readme.replace("\\\n", " ").split())
    assert "critbatch run sweeps/examples/wikitext-bpe.yaml --output" in readme


def _refused(clone: Path, d: dict, monkeypatch) -> str:
    monkeypatch.chdir(clone)
    r = CliRunner().invoke(app, ["validate", str(write_spec(clone, d, "bad.yaml"))])
    assert r.exit_code == 2, r.output
    return r.output


def test_another_tokenizer_or_a_smaller_model_vocabulary_is_refused_by_field(clone, monkeypatch):
    d = yaml.safe_load(EXAMPLE.read_text())
    byte = copy.deepcopy(d)
    byte["data"]["tokenizer"] = "byte"
    assert re.search(
        r"data.tokenizer: .*is not the tokenizer the shards were made with", _refused(clone, byte, monkeypatch)
    )
    small = copy.deepcopy(d)
    small["model"]["hf_config"]["vocab_size"] = 1024
    assert "vocab" in _refused(clone, small, monkeypatch)
