"""Lists with pagination and selectors, and watches as the module's informers make them: from a list's
resourceVersion with bookmarks, with selectors, with sendInitialEvents, and from a resourceVersion too old."""

from __future__ import annotations

import pytest
import pytest_asyncio
from differential_support import Backend, Deliberate, User

pytestmark = pytest.mark.asyncio(loop_scope="module")

NS = "diff-lw"
CM = f"/api/v1/namespaces/{NS}/configmaps"
PP = f"/apis/peering.deckhouse.io/v1alpha1/namespaces/{NS}/projectpeers"
CP = "/apis/peering.deckhouse.io/v1alpha1/clusterpeers"
MERGE = "application/merge-patch+json"


def configmap(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": name}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def seeded(pair):
    """Five ConfigMaps in a namespace of their own, labelled, on both backends."""
    for b in (pair.emulator, pair.real):
        made = await b.call("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                                 "metadata": {"name": NS}})
        assert made.status == 201, made
        for i in range(5):
            made = await b.call("POST", CM, body=configmap(f"lw-{i}", tier="odd" if i % 2 else "even", app="lw"))
            assert made.status == 201, made
    return pair


def names(answer) -> list[str]:
    return [o["metadata"]["name"] for o in answer.body.get("items", [])]


async def test_pages_with_limit_and_continue(seeded):
    async def case(b: Backend):
        s = {}
        first = await b.call("GET", CM, params={"limit": "2", "labelSelector": "app=lw"})
        s["page 1"] = first
        second = await b.call("GET", CM, params={"limit": "2", "labelSelector": "app=lw",
                                                 "continue": first.body["metadata"]["continue"]})
        s["page 2"] = second
        # A write between pages is not seen by the pages that follow: they are one snapshot.
        await b.call("POST", CM, body=configmap("lw-late", app="lw"))
        third = await b.call("GET", CM, params={"limit": "2", "labelSelector": "app=lw",
                                                "continue": second.body["metadata"]["continue"]})
        s["page 3"] = third
        s["same resourceVersion on every page"] = len({p.body["metadata"]["resourceVersion"]
                                                       for p in (first, second, third)}) == 1
        s["pages"] = [names(p) for p in (first, second, third)]
        await b.call("DELETE", f"{CM}/lw-late")
        s["garbage continue"] = await b.call("GET", CM, params={"limit": "2", "continue": "not-a-token"})
        s["limit not a number"] = await b.call("GET", CM, params={"limit": "many"})
        s["limit 0 is everything"] = await b.call("GET", CM, params={"limit": "0", "labelSelector": "app=lw"})
        return s

    await seeded.run(case, deliberate=(Deliberate(
        "garbage continue", ("body", "message"),
        "the continue token is malformed; pass the one a list answered with",
        "invalid continue token: continue key is not valid: invalid character '\\u009e' looking for beginning of "
        "value",
        "the tokens differ in form (the emulator's name a snapshot); both refuse a token they did not issue with "
        "400 BadRequest, in their own words"),))


async def test_label_and_field_selectors(seeded):
    async def case(b: Backend):
        s = {}
        s["equality"] = await b.call("GET", CM, params={"labelSelector": "tier=odd"})
        s["set"] = await b.call("GET", CM, params={"labelSelector": "tier in (even),app"})
        s["not"] = await b.call("GET", CM, params={"labelSelector": "app=lw,tier!=even"})
        s["exists not"] = await b.call("GET", CM, params={"labelSelector": "!tier"})
        s["bad label selector"] = await b.call("GET", CM, params={"labelSelector": "tier in odd"})
        s["metadata.name"] = await b.call("GET", CM, params={"fieldSelector": "metadata.name=lw-3"})
        s["metadata.name not"] = await b.call("GET", CM, params={"fieldSelector": "metadata.name!=lw-3",
                                                                 "labelSelector": "app=lw"})
        s["metadata.namespace across namespaces"] = await b.call(
            "GET", "/api/v1/configmaps", params={"fieldSelector": f"metadata.namespace={NS}",
                                                 "labelSelector": "app=lw"})
        s["unsupported field"] = await b.call("GET", CM, params={"fieldSelector": "data.k=lw-1"})
        s["custom resource unsupported field"] = await b.call("GET", CP, params={"fieldSelector": "spec.type=Join"})
        s["bad field selector"] = await b.call("GET", CM, params={"fieldSelector": "metadata.name"})
        return s

    await seeded.run(case, deliberate=(Deliberate(
        "bad label selector", ("body", "message"),
        'unable to parse requirement: invalid label key "tier in odd" in selector "tier in odd": a label key is an '
        "optional DNS prefix and '/' then a name of letters, digits, '-', '_', '.'",
        "unable to parse requirement: found 'odd' expected: '('",
        "the emulator's selector parser is not Go's lexer and words its errors its own way; the code and reason "
        "(400 BadRequest) are the same"),))


def until_types(*wanted: str):
    def done(events: list[dict]) -> bool:
        seen = [e["type"] for e in events]
        return all(seen.count(w) >= wanted.count(w) for w in set(wanted))
    return done


def event_view(events: list[dict]) -> list[dict]:
    """The events a client acts on: type, the object's name and, for bookmarks and errors, the whole object."""
    out = []
    for e in events:
        obj = e.get("object") or {}
        if e["type"] in ("BOOKMARK", "ERROR"):
            out.append(e)
        else:
            out.append({"type": e["type"], "kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"),
                        "name": (obj.get("metadata") or {}).get("name"),
                        "data": obj.get("data"), "deleting": "deletionTimestamp" in (obj.get("metadata") or {})})
    return out


async def test_watch_from_a_list_as_the_informer_does(seeded):
    async def case(b: Backend):
        s = {}
        listed = await b.call("GET", CM, params={"labelSelector": "app=lw", "limit": "500"})
        rv = listed.body["metadata"]["resourceVersion"]

        async def writes():
            await b.call("POST", CM, body=configmap("lw-w", app="lw"))
            await b.call("PATCH", f"{CM}/lw-w", content_type=MERGE, body={"data": {"k": "changed"}})
            await b.call("PATCH", f"{CM}/lw-w", content_type=MERGE, body={"metadata": {"labels": {"app": "gone"}}})
            await b.call("DELETE", f"{CM}/lw-w")

        head, events = await b.watch(CM, params={"resourceVersion": rv, "allowWatchBookmarks": "true",
                                                 "labelSelector": "app=lw", "timeoutSeconds": "30"},
                                     during=writes, until=until_types("ADDED", "MODIFIED", "DELETED"))
        s["watch"] = head
        s["events"] = event_view([e for e in events if e["type"] != "BOOKMARK"])
        s["full event"] = events[0]
        return s

    await seeded.run(case)


async def test_watch_one_name_and_the_end_of_the_stream(seeded):
    async def case(b: Backend):
        s = {}
        head, events = await b.watch(CM, params={"fieldSelector": "metadata.name=lw-1", "timeoutSeconds": "2"})
        s["watch without resourceVersion"] = head
        s["events"] = event_view(events)
        return s

    await seeded.run(case)


async def test_watch_initial_events_end_with_a_bookmark(seeded):
    async def case(b: Backend):
        s = {}
        head, events = await b.watch(CM, params={
            "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true",
            "labelSelector": "tier=odd", "timeoutSeconds": "20"}, until=lambda ev: ev and ev[-1]["type"] == "BOOKMARK")
        s["watch"] = head
        s["events"] = event_view(events)
        for name, params in (("bad resourceVersionMatch", {"resourceVersionMatch": "Exact"}),
                             ("without resourceVersionMatch", {}),
                             ("without bookmarks", {"resourceVersionMatch": "NotOlderThan"})):
            head, events = await b.watch(CM, params={"sendInitialEvents": "true", "labelSelector": "tier=odd",
                                                     "timeoutSeconds": "2", **params},
                                         until=lambda ev: ev and ev[-1]["type"] == "BOOKMARK")
            s[name] = head
            s[f"{name}: events"] = event_view(events)
        return s

    await seeded.run(case)


async def test_watch_from_a_resource_version_too_old(seeded):
    async def case(b: Backend):
        s = {}
        # A replay from resourceVersion 1 may come in several reads; it is whole once it reaches the newest write,
        # this marker (or once the server ends it with an ERROR event).
        await b.call("POST", CM, body=configmap("lw-replay-end"))
        head, events = await b.watch(CM, params={"resourceVersion": "1", "allowWatchBookmarks": "true",
                                                 "timeoutSeconds": "10"},
                                     until=lambda ev: any(e["type"] == "ERROR" or (e["type"] == "ADDED" and (
                                         e["object"].get("metadata") or {}).get("name") == "lw-replay-end")
                                         for e in ev))
        await b.call("DELETE", f"{CM}/lw-replay-end")
        s["watch"] = head
        s["events"] = events
        head, events = await b.watch(CP, params={"resourceVersion": "1", "timeoutSeconds": "10"},
                                     until=lambda ev: bool(ev))
        s["custom resource watch"] = head
        s["custom resource events"] = events
        s["resourceVersion not a number"], _ = await b.watch(CM, params={"resourceVersion": "abc",
                                                                         "timeoutSeconds": "2"})
        return s

    await seeded.run(case)


async def test_watch_forbidden_and_unknown(seeded):
    nobody = User("diff-lw-nobody")

    async def case(b: Backend):
        s = {}
        s["forbidden"] = await b.call("GET", CM, who=nobody, params={"watch": "true"})
        s["unknown resource"] = await b.call("GET", "/apis/peering.deckhouse.io/v1alpha1/nothings",
                                             params={"watch": "true"})
        return s

    await seeded.run(case)
