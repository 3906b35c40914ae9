"""`critbatch k8s render` names the local inputs the image leaves out: the job would fail in
the pod where the path does not exist."""

from __future__ import annotations

from typer.testing import CliRunner

from critbatch.main import app
from sweeps.remote.k8s import image_data_warnings
from sweeps.spec import parse_spec
from tests.conftest import write_spec


def test_shards_under_out_are_named_with_the_pattern_and_what_to_do(tmp_path, tiny_spec_dict):
    d = dict(tiny_spec_dict, data={"shards": "out/wikitext-2-bpe", "tokenizer": "data/wikitext-2-raw/bpe-2048"})
    (w,) = image_data_warnings(parse_spec(d), ["out*", "tests"])
    assert w.startswith(
        "data.shards: out/wikitext-2-bpe is excluded from the image by .dockerignore ('out*' matches out)"
    )
    assert "fsspec URI" in w and "mount a volume" in w
    r = CliRunner().invoke(app, ["k8s", "render", str(write_spec(tmp_path, d))])
    assert r.exit_code == 0, r.output
    assert "warning: data.shards: out/wikitext-2-bpe is excluded" in r.stderr
    assert "kind: RayJob" in r.stdout and "warning" not in r.stdout  # the manifests stay clean for kubectl apply


def test_bundled_data_uris_and_paths_under_app_pass_and_others_are_named(tiny_spec_dict):
    ok = dict(tiny_spec_dict, data={"path": "data/tinyshakespeare/input.txt"})
    assert image_data_warnings(parse_spec(ok), ["out*", "tests"]) == []
    assert image_data_warnings(parse_spec(dict(tiny_spec_dict, data={"shards": "s3://b/corpus"})), ["out*"]) == []
    assert image_data_warnings(parse_spec(dict(tiny_spec_dict, data={"path": "/app/data/x.txt"})), []) == []
    (w,) = image_data_warnings(parse_spec(dict(tiny_spec_dict, data={"path": "/home/me/corpus.txt"})), [])
    assert "absolute path outside the image's /app" in w
    (w,) = image_data_warnings(parse_spec(dict(tiny_spec_dict, data={"path": "tests/specs/x.txt"})), ["tests"])
    assert "('tests' matches tests)" in w


def test_the_repos_dockerignore_is_the_one_read():
    from sweeps.remote.k8s_image import DOCKERIGNORE, ignore_patterns

    assert DOCKERIGNORE.is_file() and "out*" in ignore_patterns()
