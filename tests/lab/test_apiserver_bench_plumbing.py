"""The API server benchmark's plumbing: its parsers, and a small watch fan-out against a real emulator process."""

from __future__ import annotations

import asyncio
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# bench/ is scripts run with `python -m` from the checkout, not an installed package.
_spec = importlib.util.spec_from_file_location("apiserver_bench", ROOT / "bench" / "apiserver_bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

WRK_OUTPUT = """Running 2s test @ https://127.0.0.1:40000/api/v1/namespaces/default/configmaps/small
  1 threads and 64 connections
  Latency Distribution
     50%    9.13ms
     75%  950.00us
     90%   11.43ms
     99%    1.20s
  13002 requests in 2.00s, 5.1MB read
  Non-2xx or 3xx responses: 3
Requests/sec:   6500.82
"""


def test_parse_wrk_reads_rate_percentiles_in_ms_and_errors():
    out = bench.parse_wrk(WRK_OUTPUT)
    assert out["rps"] == 6500.82
    assert out["total"] == 13002
    assert out["latency_ms"] == pytest.approx({"p50": 9.13, "p75": 0.95, "p90": 11.43, "p99": 1200.0})
    assert out["non2xx"] == 3


def test_parse_wrk_without_a_rate_says_what_wrk_printed():
    with pytest.raises(RuntimeError, match="unable to connect"):
        bench.parse_wrk("unable to connect to 127.0.0.1:1 Connection refused")


def test_median_of_takes_each_figure_separately():
    runs = [{"rps": r, "latency_ms": {"p99": p}, "server_cpu_us_per_request": c}
            for r, p, c in ((3.0, 9.0, 1.0), (1.0, 1.0, 3.0), (2.0, 5.0, 2.0))]
    out = bench.median_of(runs)
    assert (out["rps"], out["latency_ms"]["p99"], out["server_cpu_us_per_request"]) == (2.0, 5.0, 2.0)
    assert out["runs_rps"] == [3.0, 1.0, 2.0]


def test_summarize_profile_counts_self_and_inclusive_shares():
    collapsed = ("main (a/x.py:1);handle (lab/app.py:5);write (asyncio/sel.py:9) 3\n"
                 "main (a/x.py:1);handle (lab/app.py:5) 1\n"
                 "main (a/x.py:1);idle (a/x.py:2) 4\n")
    out = bench.summarize_profile(collapsed)
    assert out["samples"] == 8
    assert dict(out["self_percent"]) == {"idle (a/x.py:2)": 50.0, "write (asyncio/sel.py:9)": 37.5,
                                         "handle (lab/app.py:5)": 12.5}
    assert dict(out["inclusive_percent"])["handle (lab/app.py:5)"] == 50.0
    assert dict(out["inclusive_percent"])["main (a/x.py:1)"] == 100.0


def test_gateway_rate_reads_the_gateway_sections_keepalive_row(tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text("| measure | gateway | nginx |\n|---|---|---|\n"
                  "| keep-alive req/s, 1 worker, 64 connections | 6,612 / 8,095 | 8,802 / 9,944 |\n")
    assert bench.gateway_rate(md) == [6612.0, 8095.0]
    assert bench.gateway_rate(pathlib.Path(__file__)) == []


async def test_watches_in_an_emulator_process_all_see_one_change(tmp_path):
    emu = await asyncio.to_thread(bench.Emulator, tmp_path)
    try:
        results = await bench.measure_watches(emu, [5, 20], timeout=30)
    finally:
        await asyncio.to_thread(emu.close)
    assert emu.proc.returncode is not None
    assert [r["watches"] for r in results] == [5, 20]
    for r in results:
        assert "error" not in r, r
        assert 0 < r["first_ms"] <= r["median_ms"] <= r["all_ms"]
        assert r["server_rss_mib"] > 0
