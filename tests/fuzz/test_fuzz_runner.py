"""`make fuzz` (fuzz/run.py): one harness per parser, each harness holds on its own seeds, and the summary reads
libFuzzer's figures as libFuzzer prints them."""

from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

from fuzz import run

ROOT = pathlib.Path(__file__).resolve().parents[2]

LOG = """INFO: Seed: 1
#2\tINITED cov: 40 ft: 41 corp: 1/52b exec/s: 0 rss: 60Mb
#1024\tpulse  cov: 112 ft: 180 corp: 9/700b lim: 1043 exec/s: 512 rss: 61Mb
#52311\tDONE   cov: 118 ft: 189 corp: 15/1201b lim: 4096 exec/s: 871 rss: 63Mb
Done 52311 runs in 61 second(s)
stat::number_of_executed_units: 52311
stat::average_exec_per_sec:     871
stat::new_units_added:          14
stat::slowest_unit_time_sec:    0
stat::peak_rss_mb:              63
"""


def test_every_harness_module_is_run_and_every_run_is_a_module():
    modules = {p.stem for p in (ROOT / "fuzz").glob("*.py")} - {"__init__", "common", "run", "seeds"}
    assert set(run.HARNESSES) == modules


def test_the_summary_reads_libfuzzers_figures():
    got = run._summarise("connstring", 60, LOG, 0, [], 61.0)
    assert (got["executions"], got["coverage"], got["features"], got["corpus"], got["new_units"]) == \
        (52311, 118, 189, 15, 14)
    table = run.markdown([got])
    assert "| connstring | 60 | 52311 | 858 | 118 | 189 | 15 | none |" in table


def test_a_run_without_progress_lines_reports_zeros_not_an_error():
    got = run._summarise("csr", 5, "==1== ERROR: libFuzzer: fuzz target exited\n", 1, ["csr/crash-1"], 1.0)
    assert got["executions"] == 0 and got["crashes"] == ["csr/crash-1"] and got["exit_code"] == 1


def test_a_wrong_harness_or_time_is_refused_with_what_to_give(capsys):
    for argv, words in ((["nosuch"], "no harness nosuch; the harnesses are request_heads"),
                        (["--seconds", "0"], "--seconds must be positive")):
        with pytest.raises(SystemExit) as stopped:
            run.main(argv)
        assert stopped.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("name", run.HARNESSES)
def test_each_harness_holds_on_its_seeds_and_on_noise(name):
    pytest.importorskip("atheris", reason="the fuzz extra (pip install -e '.[fuzz]') is not installed")
    harness = importlib.import_module(f"fuzz.{name}")
    inputs = list(harness.seeds()) + [b"", b"\x00", b"\xff" * 64, b"{}", b"[]", b'{"offer": {}}', b"\x01" * 300]
    for data in inputs:
        harness.test_one_input(data)


def test_an_input_file_replays_once(tmp_path):
    """What docs/fuzzing.md says of a crash: `python -m fuzz.<harness> <file>` runs the harness on the file once
    (a file is no corpus to seed) and exits 0 when it holds."""
    pytest.importorskip("atheris", reason="the fuzz extra (pip install -e '.[fuzz]') is not installed")
    given = tmp_path / "crash-0"
    given.write_bytes(b"\n10.111.0.7\n198.51.100.1\n")
    proc = subprocess.run([sys.executable, "-m", "fuzz.client_address", str(given)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"Executed {given}" in proc.stderr and given.is_file()
