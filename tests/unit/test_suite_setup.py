"""The test command itself: the README's and .ci/run's are one command, it names its failures
(as they happen and at the end), and the suite keeps to a cache of its own."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support import real_models

ROOT = Path(__file__).parents[2]


def readme_test_command() -> str:
    """The set-up block's test command, as the README gives it."""
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if "python -m pytest" in line)
    return re.search(r"python -m pytest[^#`]*", line).group(0).strip()


def test_the_readme_and_ci_run_give_one_test_command_that_names_failures():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "python -m pytest" in line]
    assert len(ci) == 1 and ci[0].endswith(readme_test_command())
    assert "-ra" in shlex.split(readme_test_command())  # failures (and skips) named in the summary


def test_a_failure_is_named_as_it_happens(tmp_path):
    """A run stopped before its summary (a newcomer's, killed after 40 minutes) has still named
    its failures: the README's command on two files, one whose test runs for minutes and one
    whose test fails while the other runs; the failure is named before that run ends."""
    flag = tmp_path / "still-running"
    (tmp_path / "test_long.py").write_text(
        f"import pathlib, time\n\ndef test_runs_for_minutes():\n    flag = pathlib.Path({str(flag)!r})\n"
        "    flag.touch()\n    time.sleep(120)\n    flag.unlink()\n"
    )
    (tmp_path / "test_fails.py").write_text(
        f"import pathlib, time\n\ndef test_fails():\n    flag = pathlib.Path({str(flag)!r})\n"
        "    for _ in range(2000):  # until the other test runs\n"
        "        if flag.exists():\n            break\n        time.sleep(0.05)\n"
        "    assert 1 == 2\n"
    )
    pytest_args = shlex.split(readme_test_command())[3:]  # after python -m pytest
    command = [sys.executable, "-m", "pytest", *pytest_args, "-p", "tests.conftest", "-p", "no:cacheprovider"]
    running = subprocess.Popen(
        [*command, str(tmp_path / "test_long.py"), str(tmp_path / "test_fails.py")],
        cwd=ROOT,
        # not this run's xdist worker: the inner run is a run of its own (it would skip the
        # hook, as a worker does, and share this run's locks)
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen, named_while_running = [], False
    try:
        for line in running.stdout:
            seen.append(line.rstrip())
            if line.startswith("FAILED"):
                named_while_running = flag.exists()  # the long test had not ended: no summary yet
                break
    finally:
        running.kill()
        running.wait()
    assert seen and "test_fails.py::test_fails" in seen[-1] and named_while_running, seen


def test_the_tests_keep_to_their_own_cache():
    """The suite's downloads, imports and locks go to the tests' own cache, not the user's
    (`mlxspec models list` run from a test names the cache it sees), and .ci/run fetches the
    real models into that same one."""
    done = subprocess.run(
        [sys.executable, "-m", "mlxspec", "models", "list", "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    cache = Path(json.loads(done.stdout)["cache"])
    users = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "mlxspec"
    assert cache == real_models.tests_cache() and cache != users
    fetch = next(line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "real_models" in line)
    assert "r.use_tests_cache();" in fetch.split("[r.folder")[0]


def test_every_test_that_bounds_elapsed_seconds_is_marked_alone():
    """A test that asserts how many seconds something took is `alone` (under -n 2 it has the
    machine to itself; on a machine busy with other work, `-m "not alone"` leaves it out)."""
    import ast

    elapsed = re.compile(r"(perf_counter|monotonic)\(\)\s*-\s*\w+\s*<|\belapsed\s*<")
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        if "pytest.mark.alone" in "".join(
            ast.get_source_segment(source, node) or "" for node in tree.body if isinstance(node, ast.Assign)
        ):
            continue  # pytestmark = pytest.mark.alone: every test of the file
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                marked = any("mark.alone" in ast.unparse(d) for d in node.decorator_list)
                if elapsed.search(ast.get_source_segment(source, node)) and not marked:
                    unmarked.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert unmarked == []


def _collected(*marks: str) -> dict[str, int]:
    """Tests per file, as `python -m pytest --collect-only -q` (with `-m`, when given) counts them."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *marks]
    listing = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    counts: dict[str, int] = {}
    for line in listing.splitlines():
        if "::" in line:
            path = line.split("::")[0]
            counts[path] = counts.get(path, 0) + 1
    return counts


def test_the_docs_count_the_tests_there_are():
    """exactness.md's table gives every test file and its tests (slow ones in brackets), its
    totals and the README's are the suite's: a test added or removed changes them."""
    every, slow = _collected(), _collected("-m", "slow")
    listed = {}
    exactness = (ROOT / "docs" / "exactness.md").read_text()
    for row in (line for line in exactness.splitlines() if line.startswith("| `")):
        folder = row.split("`")[1].rstrip("/")
        for name, count, slow_count in re.findall(r"`(test_\w+\.py)` (\d+)(?: \((\d+)\))?", row):
            listed[f"tests/{folder}/{name}"] = (int(count), int(slow_count or 0))
    assert listed == {path: (n, slow.get(path, 0)) for path, n in every.items()}
    total, quick, marked = sum(every.values()), sum(every.values()) - sum(slow.values()), sum(slow.values())
    assert (
        f"counts {total} tests in {len(every)} files, {quick} of\nthem in the quick check ({marked} marked slow)"
        in (exactness)
    )
    readme = (ROOT / "README.md").read_text()
    assert f"the whole suite has {total} tests" in readme and f"quick check ({quick} tests;" in readme
