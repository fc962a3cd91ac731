"""Run pytest again and again to find what passes only sometimes (`make test-repeat`).

    python tools/repeat.py --runs 10 [--burn] [--keep-going] -- [pytest arguments]

Each run is a whole pytest session of its own (fresh labs, fresh processes), as `make test` runs it; a test that
fails in any run is a race until shown otherwise. With `--burn`, one CPU burner per core runs alongside every run
(plain busy loops in processes of their own, at the same priority as the tests), as a loaded CI machine would be.
It stops at the first failing run unless `--keep-going`, prints each run's outcome and wall time as it ends and a
summary at the end, and writes that summary to build/repeat/summary.txt; the output of a failing run is kept in
build/repeat/run-<n>.log. Exit 0 only when every run passed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "repeat"
BURNER = "while True: pass"
#: How long an interrupted session may take to stop its labs before it is killed.
STOP_SECONDS = 120
# pytest's last line: "3 failed, 40 passed, 2 skipped in 12.34s".
SUMMARY = re.compile(r"^=*\s*(?P<text>(\d+ \w+(, )?)+ in [\d.]+s.*?)\s*=*$")


def _burners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for _ in range(count)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait()


def _session(pytest_args: list[str]) -> subprocess.CompletedProcess:
    """One pytest session; interrupted (Ctrl-C, SIGTERM), it is interrupted too, so that it stops its labs."""
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate()
    except BaseException:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def _interrupted(signum: int, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _outcome(output: str) -> str:
    for line in reversed(output.splitlines()):
        m = SUMMARY.match(line.strip())
        if m:
            return m["text"]
    return "no pytest summary (see the log)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/repeat.py", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="how many sessions (default 10)")
    parser.add_argument("--burn", action="store_true", help="one CPU burner per core alongside every run")
    parser.add_argument("--keep-going", action="store_true", help="do not stop at the first failing run")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: what pytest gets")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: give 1 or more")
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    signal.signal(signal.SIGTERM, _interrupted)
    OUT.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    lines = [f"{args.runs} runs of pytest {' '.join(pytest_args)}"
             + (f", each with {cores} CPU burners alongside" if args.burn else "") + f", on {cores} cores"]
    print(lines[0], flush=True)
    failed = 0
    total = time.monotonic()
    for n in range(1, args.runs + 1):
        burners = _burners(cores) if args.burn else []
        start = time.monotonic()
        try:
            done = _session(pytest_args)
        finally:
            _stop(burners)
        took = time.monotonic() - start
        load = os.getloadavg()[0]
        line = (f"run {n}: {'passed' if done.returncode == 0 else f'FAILED (exit {done.returncode})'} in "
                f"{took:.0f} s, load {load:.1f}: {_outcome(done.stdout)}")
        if done.returncode != 0:
            failed += 1
            log = OUT / f"run-{n}.log"
            log.write_text(done.stdout)
            line += f"; output in {log.relative_to(ROOT)}"
            line += "".join(f"\n    {f}" for f in re.findall(r"^(?:FAILED|ERROR) .*$", done.stdout, re.M))
        print(line, flush=True)
        lines.append(line)
        if done.returncode != 0 and not args.keep_going:
            break
    ran = len(lines) - 1
    lines.append(f"{ran - failed} of {ran} runs passed, {time.monotonic() - total:.0f} s in all")
    print(lines[-1], flush=True)
    (OUT / "summary.txt").write_text("\n".join(lines) + "\n")
    return 0 if failed == 0 and ran == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
