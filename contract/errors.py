"""The one error type of a refused request or an unusable input: HTTP code, machine-readable reason, message.

The message says what was wrong and what to do, in the user's words; it never carries a secret (a token, a key).
"""

from __future__ import annotations

from contract import reasons


class Refusal(Exception):
    """A refusal answered as a Kubernetes Status with this code, reason and message (gateway and control)."""

    def __init__(self, code: int, reason: str, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        #: Seconds after which a retry may succeed (a 429), answered as Retry-After and details.retryAfterSeconds.
        self.retry_after = retry_after


class InputError(Refusal, ValueError):
    """Input the module cannot use; the code is the one its reason has on the wire (`codes`, else 400).

    Subclasses name where the input came from so that callers can tell them apart: `pki.PKIError`,
    `connstring.ConnectionStringError`, `rules.invite.InviteError`, `rules.join.JoinError`."""

    codes: dict[str, int] = reasons.CODES

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(self.codes.get(reason, 400), reason, message)
