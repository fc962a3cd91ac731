"""Kubernetes Status objects: every refusal the gateway makes, in the shape kubectl and client-go show."""

from __future__ import annotations

import json

from contract.errors import Refusal


def status_body(code: int, reason: str, message: str) -> bytes:
    """The JSON of a failed Status. `reason` is the gateway's own machine-readable cause (kubectl prints it as
    "Error from server (<reason>)"), so that the person reading it knows which rule refused the request."""
    return json.dumps({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason,
        "details": {"causes": [{"reason": reason, "message": message}]},
        "code": code,
    }, separators=(",", ":")).encode()


def refusal_body(refusal: Refusal) -> bytes:
    return status_body(refusal.code, refusal.reason, refusal.message)
