"""Kubernetes Status bodies and answers for every refusal (gateway/status.py)."""

from __future__ import annotations

import json

from gateway.status import status_answer, status_body


def test_status_body_is_a_kubernetes_status():
    body = json.loads(status_body(403, "PeerUnknown", "gone"))
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "gone",
                    "reason": "PeerUnknown", "details": {"causes": [{"reason": "PeerUnknown", "message": "gone"}]},
                    "code": 403}


def test_a_raw_path_refusal_is_a_whole_http_answer_with_its_status():
    answer = status_answer(403, "PeerUnknown", "gone", close=True)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n") == [b"HTTP/1.1 403 Forbidden", b"Content-Type: application/json",
                                    b"Content-Length: %d" % len(body), b"Connection: close"]
    assert json.loads(body)["reason"] == "PeerUnknown"
    assert b"Connection" not in status_answer(401, "TokenMissing", "no token")
