"""Kubernetes Status objects: every refusal the gateway makes, in the shape kubectl and client-go show."""

from __future__ import annotations

import json


class Refusal(Exception):
    """A request the gateway answers itself. `cause` is the machine-readable reason (e.g. TokenExpired)."""

    def __init__(self, code: int, cause: str, message: str):
        super().__init__(f"{code} {cause}: {message}")
        self.code = code
        self.cause = cause
        self.message = message


def status_body(code: int, cause: str, message: str) -> bytes:
    """The JSON of a failed Status. `reason` is the gateway's own machine-readable cause (kubectl prints it as
    "Error from server (<reason>)"), so that the person reading it knows which rule refused the request."""
    return json.dumps({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": cause,
        "details": {"causes": [{"reason": cause, "message": message}]},
        "code": code,
    }, separators=(",", ":")).encode()


def refusal_body(refusal: Refusal) -> bytes:
    return status_body(refusal.code, refusal.cause, refusal.message)
