"""Run every harness for a bounded time, one after the other, and write a summary (`make fuzz`).

    python -m fuzz.run [--seconds 60] [--out build/fuzz] [HARNESS ...]

Each harness keeps its corpus in OUT/<harness>/corpus (a later run starts from it) and writes a crashing input to
OUT/<harness>/crash-<sha1>. The summary (OUT/summary.md and summary.json) gives per harness the executions, the
coverage libFuzzer counted (cov: edges of the instrumented Python code and native extensions, ft: features), the
corpus size and the crashes. The exit status is 1 when any harness crashed. FUZZ_SECONDS sets the default time.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

HARNESSES = ("request_heads", "response_framer", "connstring", "join_body", "offer", "csr", "peer_token", "token_claims",
             "dex_answer", "token_review", "client_address", "egress_path")
ROOT = pathlib.Path(__file__).resolve().parents[1]
_PROGRESS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_STAT = re.compile(r"stat::(\w+):\s+(\d+)")


def _summarise(name: str, seconds: int, log: str, rc: int, crashes: list[str], wall: float) -> dict:
    progress = _PROGRESS.findall(log)
    stats = dict(_STAT.findall(log))
    last = progress[-1] if progress else ("0", "0", "0", "0")
    return {
        "harness": name, "seconds": seconds, "wall_seconds": round(wall, 1),
        "executions": int(stats.get("number_of_executed_units", last[0])),
        "coverage": int(last[1]), "features": int(last[2]), "corpus": int(last[3]),
        "new_units": int(stats.get("new_units_added", 0)), "peak_rss_mb": int(stats.get("peak_rss_mb", 0)),
        "exit_code": rc, "crashes": crashes,
    }


def run_one(name: str, seconds: int, out: pathlib.Path) -> dict:
    where = out / name
    corpus = where / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    before = set(where.glob("crash-*"))
    cmd = [sys.executable, "-m", f"fuzz.{name}", f"-max_total_time={seconds}", "-print_final_stats=1",
           "-timeout=20", "-rss_limit_mb=2048", f"-artifact_prefix={where}/", str(corpus)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, errors="replace",
                          timeout=seconds * 3 + 120)
    wall = time.monotonic() - started
    (where / "log.txt").write_text(proc.stdout + proc.stderr)
    crashes = sorted(str(p.relative_to(out)) for p in set(where.glob("crash-*")) - before)
    return _summarise(name, seconds, proc.stdout + proc.stderr, proc.returncode, crashes, wall)


def markdown(results: list[dict]) -> str:
    lines = ["| harness | seconds | executions | exec/s | cov | ft | corpus | crashes |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        rate = r["executions"] / r["wall_seconds"] if r["wall_seconds"] else 0
        lines.append(f"| {r['harness']} | {r['seconds']} | {r['executions']} | {rate:.0f} | {r['coverage']} | "
                     f"{r['features']} | {r['corpus']} | {', '.join(r['crashes']) or 'none'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", "60")),
                   help="seconds per harness (default: $FUZZ_SECONDS or 60)")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "fuzz", help="corpora, crashes, summary")
    p.add_argument("harness", nargs="*", help=f"the harnesses to run (default: all of {', '.join(HARNESSES)})")
    args = p.parse_args(argv)
    if args.seconds <= 0:
        p.error("--seconds must be positive")
    unknown = [h for h in args.harness if h not in HARNESSES]
    if unknown:
        p.error(f"no harness {', '.join(unknown)}; the harnesses are {', '.join(HARNESSES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.harness or HARNESSES:
        print(f"fuzz: {name} for {args.seconds} s", flush=True)
        result = run_one(name, args.seconds, args.out)
        results.append(result)
        print(f"fuzz: {name}: {result['executions']} executions, cov {result['coverage']}, "
              f"{len(result['crashes'])} crashes", flush=True)
    table = markdown(results)
    (args.out / "summary.md").write_text(table)
    (args.out / "summary.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table + f"summary: {args.out / 'summary.md'}")
    return 1 if any(r["crashes"] or r["exit_code"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
