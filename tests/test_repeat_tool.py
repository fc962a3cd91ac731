"""`make test-repeat` (tools/repeat.py): whole sessions one after another, stopping at the first that fails, with
each run's outcome and the CPU burners gone afterwards."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _repeat(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "repeat.py"), *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))


def test_every_run_passes_or_the_first_failure_stops_it(tmp_path):
    flaky = tmp_path / "test_flaky.py"
    marker = tmp_path / "ran"
    # Passes the first time, fails the second: a test that passes only sometimes.
    flaky.write_text(f"import pathlib\n\ndef test_once():\n    m = pathlib.Path({str(marker)!r})\n"
                     f"    seen = m.exists()\n    m.write_text('x')\n    assert not seen, 'failed on a later run'\n")
    done = _repeat(tmp_path, "--runs", "3", "--", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                   "-c", os.devnull, str(flaky))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("run 1: passed in ") and "1 passed" in lines[1]
    assert lines[2].startswith("run 2: FAILED (exit 1)") and "1 failed" in lines[2]
    assert "FAILED " in lines[3] and "test_once" in lines[3]
    assert lines[-1].startswith("1 of 2 runs passed")  # the third never ran
    assert (ROOT / "build" / "repeat" / "run-2.log").read_text().count("failed on a later run") >= 1


def test_burners_run_alongside_and_are_gone_afterwards(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import os\n\ndef test_burners_alongside():\n    assert os.getloadavg() is not None\n")
    before = {p for p in os.listdir("/proc") if p.isdigit()}
    done = _repeat(tmp_path, "--runs", "1", "--burn", "--", "-q", "-p", "no:cacheprovider", "--rootdir",
                   str(tmp_path), "-c", os.devnull, str(probe))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU burners alongside" in done.stdout.splitlines()[0]
    left = []
    for pid in {p for p in os.listdir("/proc") if p.isdigit()} - before:
        try:
            cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"while True: pass" in cmd:
            left.append(pid)
    assert left == []
