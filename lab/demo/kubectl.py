"""Running the real kubectl against the lab clusters: `Kubectl` (one cluster and one identity, each command shown
before its output as an administrator would type it), `Watch` (`kubectl get -w` in the background), and reading
what kubectl prints (tables, conditions, the request log of `-v=6`)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
from typing import Callable

from lab.demo.failure import StepFailed

KUBECTL = str(pathlib.Path(sys.executable).with_name("kubectl"))
# One answered request in kubectl's `-v=6` log.
REQUEST_LOG = re.compile(r'"Response" verb="(?P<verb>[A-Z]+)" url="(?P<url>[^"]+)" status="(?P<status>[^"]+)"')


def quote(args: list[str]) -> str:
    """A command line as a shell would take it."""
    return " ".join(shlex.quote(a) for a in args)


def errors_of(stderr: str) -> str:
    """What kubectl says at its default verbosity, from the output of `-v=6`."""
    return "\n".join(line for line in stderr.splitlines() if line.startswith(("Error", "error:", "Warning")))


@dataclasses.dataclass
class Kubectl:
    """kubectl for one cluster and one identity; `prompt` is how its commands are shown (`a$`, `b (consumer)$`)."""

    prompt: str
    kubeconfig: pathlib.Path
    cache_dir: pathlib.Path
    out: Callable[[str], None]

    def argv(self, args: tuple[str, ...] | list[str]) -> list[str]:
        return [KUBECTL, "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache_dir), *args]

    def command(self, args: tuple[str, ...] | list[str], stdin: str | None = None) -> str:
        shown = f"kubectl {quote(list(args))}"
        return shown + (" <<EOF" if stdin is not None else "")

    def run(self, *args: str, stdin: str | None = None, show: bool = True,
            timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run kubectl; when `show`, print the command (and its input), then what it printed."""
        if show:
            self.out(f"{self.prompt} {self.command(args, stdin)}")
            if stdin is not None:
                self.out(stdin.rstrip("\n") + "\nEOF")
        done = subprocess.run(self.argv(args), input=stdin, capture_output=True, text=True, timeout=timeout,
                              stdin=None if stdin is not None else subprocess.DEVNULL)
        if show:
            for text in (done.stdout, done.stderr):
                if text.strip():
                    self.out(text.rstrip("\n"))
        return done

    def ok(self, step: str, *args: str, stdin: str | None = None, show: bool = True,
           expect: str = "success") -> subprocess.CompletedProcess:
        """Run kubectl and require exit code 0."""
        done = self.run(*args, stdin=stdin, show=show)
        if done.returncode != 0:
            raise StepFailed(step, f"{self.prompt} {self.command(args, stdin)}", expect,
                             f"exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
        return done

    def get_json(self, step: str, *args: str) -> dict:
        done = self.ok(step, "get", *args, "-o", "json", show=False)
        return json.loads(done.stdout)

    def get_optional(self, *args: str) -> dict | None:
        """The object as JSON, or None when kubectl cannot get it (absent, or the server did not answer)."""
        done = self.run("get", *args, "-o", "json", show=False)
        if done.returncode != 0:
            return None
        return json.loads(done.stdout)


def condition(obj: dict | None, ctype: str) -> dict:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return {}


def describe_peer(obj: dict | None) -> str:
    """phase, Ready status, reason and message of a ClusterPeer, for a step's "got"."""
    if obj is None:
        return "no such object"
    ready = condition(obj, "Ready")
    return (f"phase={obj.get('status', {}).get('phase')!r} Ready={ready.get('status')!r} "
            f"reason={ready.get('reason')!r} message={ready.get('message')!r}")


def parse_table(text: str) -> list[dict[str, str]]:
    """Rows of a kubectl table by column name; columns are cut where the header's names start, as kubectl aligns
    them, so an empty cell stays empty."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    names = lines[0].split()
    ends = starts[1:] + [None]
    return [{n: line[a:b].strip() for n, a, b in zip(names, starts, ends)} for line in lines[1:]]



class Watch:
    """`kubectl get -w` running in the background, its lines collected as they come."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._queue: "queue.Queue[str | None]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="kubectl-watch", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_line(self, predicate: Callable[[str], bool], timeout: float) -> str | None:
        """The first line (old or new) for which `predicate` holds, waiting up to `timeout` seconds."""
        for line in self.lines:
            if predicate(line):
                return line
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                self._queue.put(None)  # keep the end visible to later calls
                return None
            self.lines.append(line)
            if predicate(line):
                return line
        return None

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
