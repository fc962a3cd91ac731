"""The comparison itself, without servers: a difference fails with both answers shown, volatile values are
normalised key by key, a deliberate difference must be exactly as documented, and causes compare in any order."""

from __future__ import annotations

import pytest
from differential_support import ABSENT, Answer, Backend, Deliberate, Pair, differences, normalise, reduce_answer

from lab import certs

PKI = certs.cluster_pki("h")


def backend(name: str) -> Backend:
    return Backend(name, f"https://127.0.0.1:{1000 if name == 'emulator' else 2000}", PKI)


def answer(status: int, body) -> Answer:
    return Answer("GET /x", status, "application/json", body, [], {})


def test_differences_name_every_place():
    found = differences({"a": 1, "b": [1, 2], "c": {"d": "x"}, "e": 1},
                        {"a": 2, "b": [1], "c": {"d": "x"}, "f": 1})
    assert found == ["a: emulator 1 != real 2", "b: 2 items (emulator) != 1 items (real)",
                     "e: only the emulator has it: 1", "f: only the real kube-apiserver has it: 1"]
    assert differences(1, 1.0) == [": emulator 1 != real 1.0"]   # a type is part of the shape


def test_volatile_values_become_their_form_and_the_server_its_name():
    b = backend("real")
    got = normalise({"metadata": {"uid": "u-1", "resourceVersion": "7", "name": "n", "managedFields": [{}],
                                  "creationTimestamp": None},
                     "message": f"see {b.url}/api", "extra": ["JTI=0f8f-ad5b"]}, b)
    assert got == {"metadata": {"uid": "<uid:str>", "resourceVersion": "<resourceVersion:str>", "name": "n",
                                "creationTimestamp": None},
                   "message": "see <server>/api", "extra": ["JTI=<jti>"]}


async def test_a_difference_fails_with_both_answers():
    pair = Pair(backend("emulator"), backend("real"))

    async def case(b: Backend):
        return {"get": answer(200 if b.name == "emulator" else 404, {"kind": "Thing", "n": b.name})}

    with pytest.raises(AssertionError) as failed:
        await pair.run(case)
    text = str(failed.value)
    assert "get: status: emulator 200 != real 404" in text and '"n": "emulator"' in text and '"n": "real"' in text


async def test_a_deliberate_difference_is_checked_as_documented():
    pair = Pair(backend("emulator"), backend("real"))

    async def case(b: Backend):
        return {"get": answer(200, {"message": "mine" if b.name == "emulator" else "theirs", "same": 1})}

    await pair.run(case, deliberate=(Deliberate("get", ("body", "message"), "mine", "theirs", "why"),))
    with pytest.raises(AssertionError, match="no longer as documented"):
        await pair.run(case, deliberate=(Deliberate("get", ("body", "message"), "mine", "other", "why"),))
    with pytest.raises(AssertionError, match="no longer as documented"):
        await pair.run(case, deliberate=(Deliberate("get", ("body", "gone"), "mine", ABSENT, "why"),))


def test_invalid_causes_compare_in_any_order_but_not_any_content():
    b = backend("real")

    def status(causes, message):
        return answer(422, {"kind": "Status", "reason": "Invalid", "message": message,
                            "details": {"causes": causes}})

    one = {"field": "spec.a", "message": "Required value", "reason": "FieldValueRequired"}
    two = {"field": "spec.b", "message": "Too long", "reason": "FieldValueTooLong"}
    first = reduce_answer(status([one, two], 'X "n" is invalid: [spec.a: Required value, spec.b: Too long]'), b)
    second = reduce_answer(status([two, one], 'X "n" is invalid: [spec.b: Too long, spec.a: Required value]'), b)
    assert first == second
    wrong = reduce_answer(status([two, one], 'X "n" is invalid: [spec.b: Too long, spec.a: Something else]'), b)
    assert wrong != first
