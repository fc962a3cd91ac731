"""What `peering check` says: one line per check, ✓ (works), ✗ (broken: the reason and the fix follow) or
! (cannot tell, or not broken yet: why, and what to do to know), as text for a person or JSON for a machine."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

OK, FAIL, WARN = "ok", "fail", "warn"
SYMBOLS = {OK: "✓", FAIL: "✗", WARN: "!"}


@dataclass(frozen=True)
class Line:
    """One check's verdict. `reason` is a machine-readable word (a condition's reason, a Status reason, or the
    check's own), `fix` what to do about a failure or a warning."""

    status: str
    check: str
    message: str
    reason: str = ""
    fix: str = ""
    peer: str = ""

    def text(self) -> str:
        head = f"{SYMBOLS[self.status]} {self.check}: {self.message}"
        if self.reason and self.status != OK:
            head = f"{SYMBOLS[self.status]} {self.check}: [{self.reason}] {self.message}"
        return head + (f"\n    fix: {self.fix}" if self.fix and self.status != OK else "")


def ok(check: str, message: str, **kw) -> Line:
    return Line(OK, check, message, **kw)


def fail(check: str, message: str, fix: str, reason: str = "", **kw) -> Line:
    return Line(FAIL, check, message, reason=reason, fix=fix, **kw)


def warn(check: str, message: str, fix: str = "", reason: str = "", **kw) -> Line:
    return Line(WARN, check, message, reason=reason, fix=fix, **kw)


@dataclass
class Report:
    lines: list[Line] = field(default_factory=list)

    def add(self, *lines: Line) -> None:
        self.lines.extend(lines)

    @property
    def healthy(self) -> bool:
        """No check failed (warnings do not make a cluster unhealthy)."""
        return not any(line.status == FAIL for line in self.lines)

    @property
    def exit_code(self) -> int:
        return 0 if self.healthy else 1

    def text(self) -> str:
        failed = sum(1 for line in self.lines if line.status == FAIL)
        warned = sum(1 for line in self.lines if line.status == WARN)
        summary = ("healthy" if not failed else f"{failed} check{'s' if failed > 1 else ''} failed") + (
            f", {warned} warning{'s' if warned > 1 else ''}" if warned else "")
        return "\n".join([line.text() for line in self.lines] + [f"peering check: {summary}"]) + "\n"

    def json(self) -> str:
        return json.dumps({"healthy": self.healthy, "checks": [asdict(line) for line in self.lines]}, indent=2) + "\n"
