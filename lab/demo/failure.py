"""`StepFailed`: a step of the story did not end as the guide says (every module of the demo raises it)."""

from __future__ import annotations


class StepFailed(Exception):
    """A step did not end as the guide says."""

    def __init__(self, step: str, command: str, expected: str, got: str) -> None:
        self.step, self.command, self.expected, self.got = step, command, expected, got
        super().__init__(f"{step}\n  command:  {command}\n  expected: {expected}\n  got:      {got}")
