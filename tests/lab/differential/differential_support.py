"""The differential test's machinery: one client per backend, the same request sent to both, answers normalised
and compared, and the documented deliberate differences checked as documented.

A case is an async function of one `Backend` that makes its requests in order and returns the answers it wants
compared, by step name. `Pair.run(case)` runs it on the emulator, then on the real kube-apiserver, and fails with
every difference and both answers in full. Each step's answer is reduced to what a client reads: the status code,
the reason, the media type, and the body with its volatile values (uids, resourceVersions, timestamps, tokens,
continue tokens, the server's own address) replaced by what they are (`<resourceVersion>`), explicitly, key by key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import ssl
from typing import Any, Awaitable, Callable, Mapping

import aiohttp
import yaml

from lab import certs

ADMIN = "admin"  # the cluster's admin: CN=admin, O=system:masters, by client certificate on both backends
ANONYMOUS = "anonymous"


@dataclasses.dataclass(frozen=True)
class User:
    """A user authenticated by a client certificate of the shared client CA (CN = name, O = each group)."""

    name: str
    groups: tuple[str, ...] = ()


@dataclasses.dataclass
class Answer:
    request: str
    status: int
    content_type: str
    body: Any
    warnings: list[str]
    headers: Mapping[str, str]

    @property
    def reason(self) -> str:
        if isinstance(self.body, dict) and self.body.get("kind") == "Status":
            return str(self.body.get("reason", ""))
        return ""


class Backend:
    """One API server (the emulator or the real kube-apiserver) as its clients see it, over real TLS."""

    def __init__(self, name: str, url: str, pki: certs.ClusterPKI, user_certs: dict | None = None) -> None:
        self.name = name
        self.url = url
        self.pki = pki
        self._session: aiohttp.ClientSession | None = None
        self._contexts: dict[Any, ssl.SSLContext] = {}
        # Shared between the two backends: the same user presents the same certificate to both.
        self._certs: dict[User, certs.CertKey] = {} if user_certs is None else user_certs

    async def open(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def cert(self, user: User) -> certs.CertKey:
        if user not in self._certs:
            self._certs[user] = self.pki.client_ca.issue_client(user.name, list(user.groups))
        return self._certs[user]

    def context(self, who: str | User | None) -> ssl.SSLContext:
        """The client TLS context of `who`: the admin's or a user's certificate; none for tokens and anonymous."""
        key = who if isinstance(who, User) else (who or ANONYMOUS)
        if key not in self._contexts:
            cert = self.pki.admin if key == ADMIN else self.cert(key) if isinstance(key, User) else None
            self._contexts[key] = certs.client_ssl_context(self.pki.public_ca.cert_pem, cert)
        return self._contexts[key]

    async def call(self, method: str, path: str, *, who: str | User | None = ADMIN, token: str | None = None,
                   body: Any = None, data: bytes | str | None = None, content_type: str | None = None,
                   params: Mapping[str, str] | None = None, accept: str = "application/json") -> Answer:
        """One request; `who` is ADMIN, a User, or None/ANONYMOUS (then `token` is the bearer, if any)."""
        assert self._session is not None, "Backend.open() first"
        headers = {"Accept": accept}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
            who = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = content_type or "application/json"
        elif data is not None:
            headers["Content-Type"] = content_type or "application/json"
        async with self._session.request(method, self.url + path, params=dict(params or {}), data=data,
                                         headers=headers, ssl=self.context(who)) as r:
            return await _answer(f"{method} {path}", r)

    async def watch(self, path: str, *, params: Mapping[str, str], who: str | User | None = ADMIN,
                    until: Callable[[list[dict]], bool] | None = None, during: Callable[[], Awaitable] | None = None,
                    timeout: float = 20.0, accept: str = "application/json") -> tuple[Answer, list[dict]]:
        """A watch request: its answer (body None when it streams) and the events read until `until(events)` is
        true or the server ends the stream; `during` runs once the stream is open (the writes to be seen)."""
        assert self._session is not None
        events: list[dict] = []
        query = {"watch": "true", **params}
        async with self._session.get(self.url + path, params=query, headers={"Accept": accept},
                                     ssl=self.context(who),
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            if r.status != 200:
                return await _answer(f"WATCH {path}", r), events
            head = Answer(f"WATCH {path}", r.status, _media_type(r.headers), None, [], dict(r.headers))
            writer = asyncio.create_task(during()) if during is not None else None
            try:
                buf = b""
                async for chunk in r.content.iter_any():
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if line.strip():
                            events.append(json.loads(line))
                    if until is not None and until(events):
                        break
            finally:
                if writer is not None:
                    await writer
            return head, events


async def _answer(request: str, r: aiohttp.ClientResponse) -> Answer:
    raw = await r.read()
    text = raw.decode("utf-8", "replace")
    try:
        if _media_type(r.headers) == "application/yaml":
            body: Any = yaml.safe_load(text)
        else:
            body = json.loads(text) if text else None
    except (ValueError, yaml.YAMLError):
        body = text
    return Answer(request, r.status, _media_type(r.headers), body, r.headers.getall("Warning", []), dict(r.headers))


def _media_type(headers: Mapping[str, str]) -> str:
    return headers.get("Content-Type", "").split(";")[0].strip()


# --- normalisation --------------------------------------------------------------------------------------------

# Keys whose values are the server's own (volatile) choice: compared by presence and type only.
VOLATILE_KEYS = {
    "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "lastTransitionTime",
    "expirationTimestamp", "renewTime", "acquireTime", "token", "selfLink",
}
# managedFields: the emulator keeps none (a known simplification, listed in lab/README.md); dropped before the
# comparison so that every other key of metadata is compared.
DROPPED_KEYS = {"managedFields"}
# Values inside strings that are volatile: the server's own address and resourceVersion numbers in messages.
_RV_IN_TEXT = [
    (re.compile(r"(ResourceVersion in precondition: )\d+"), r"\1<rv>"),
    (re.compile(r"(ResourceVersion in object meta: )\d+"), r"\1<rv>"),
    (re.compile(r"(UID in precondition: )[0-9a-f-]+"), r"\1<uid>"),
    (re.compile(r"(UID in object meta: )[0-9a-f-]*"), r"\1<uid>"),
    (re.compile(r"(too old resource version: )\d+ \(\d+\)"), r"\1<rv> (<rv>)"),
    (re.compile(r"(the ResourceVersion in record )\(\d+\)"), r"\1(<rv>)"),
    (re.compile(r"(the UID in record )\([0-9a-f-]+\)"), r"\1(<uid>)"),
    (re.compile(r"^JTI=[0-9a-f-]+$"), "JTI=<jti>"),   # a ServiceAccount token's id, in a user's extra
]


def _placeholder(value: Any, key: str) -> Any:
    if value is None or value == "":
        return value  # absent and empty are a difference worth seeing
    return f"<{key}:{type(value).__name__}>"


def normalise(value: Any, backend: Backend, *, key: str = "", volatile: frozenset[str] = frozenset()) -> Any:
    """`value` with volatile values replaced by placeholders, the server's URL by `<server>`."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in DROPPED_KEYS:
                continue
            if k in VOLATILE_KEYS or k in volatile:
                out[k] = _placeholder(v, k)
            elif k == "continue" and isinstance(v, str):
                out[k] = _placeholder(v, k)
            else:
                out[k] = normalise(v, backend, key=k, volatile=volatile)
        return out
    if isinstance(value, list):
        return [normalise(v, backend, key=key, volatile=volatile) for v in value]
    if isinstance(value, str):
        value = value.replace(backend.url, "<server>").replace(backend.url.split("//", 1)[-1], "<server address>")
        for pattern, repl in _RV_IN_TEXT:
            value = pattern.sub(repl, value)
        return value
    return value


def _canonical_invalid(body: Any) -> Any:
    """An Invalid Status with its causes in a stable order. kube-apiserver's order is not stable: it validates an
    object's properties in Go map order, so the same request lists its causes in another order each time (the
    message follows them). When the message is exactly the causes joined, in whatever order, it is rewritten with
    the causes sorted; any other message is left as it is, to be compared."""
    if not (isinstance(body, dict) and body.get("kind") == "Status" and isinstance(body.get("details"), dict)
            and isinstance(body["details"].get("causes"), list) and isinstance(body.get("message"), str)):
        return body
    causes = body["details"]["causes"]
    parts = list(dict.fromkeys(f"{c.get('field')}: {c.get('message')}" if c.get("field") else c.get("message", "")
                               for c in causes))
    prefix, sep, rest = body["message"].partition(" is invalid: ")
    if not sep:
        return body
    inner = rest[1:-1] if len(parts) > 1 and rest.startswith("[") and rest.endswith("]") else rest
    if len(inner) != len(", ".join(parts)) or not all(p in inner for p in parts):
        return body
    ordered = sorted(parts)
    joined = ordered[0] if len(ordered) == 1 else "[" + ", ".join(ordered) + "]"
    details = dict(body["details"], causes=sorted(causes, key=lambda c: json.dumps(c, sort_keys=True)))
    return dict(body, message=f"{prefix} is invalid: {joined}", details=details)


def reduce_answer(answer: Answer, backend: Backend, *, volatile: frozenset[str] = frozenset(), body: bool = True) -> dict:
    """What the comparison sees of one answer."""
    out: dict[str, Any] = {"status": answer.status, "reason": answer.reason, "contentType": answer.content_type}
    if answer.warnings:
        out["warnings"] = [normalise(w, backend) for w in answer.warnings]
    if body:
        out["body"] = _canonical_invalid(normalise(answer.body, backend, volatile=volatile))
    return out


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Every place where `a` (the emulator's) and `b` (the real one's) differ, as `path: a != b` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{where}.{k}" if where else str(k)
            if k not in a:
                out.append(f"{p}: only the real kube-apiserver has it: {json.dumps(b[k])[:300]}")
            elif k not in b:
                out.append(f"{p}: only the emulator has it: {json.dumps(a[k])[:300]}")
            else:
                out += differences(a[k], b[k], p)
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = []
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} items (emulator) != {len(b)} items (real)")
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{where}[{i}]")
        return out
    if a != b or type(a) is not type(b):
        return [f"{where}: emulator {json.dumps(a)[:300]} != real {json.dumps(b)[:300]}"]
    return []


# --- deliberate differences -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Deliberate:
    """A difference kept on purpose (each is a row of the table in lab/README.md): at `path` of step `step`'s
    reduced answer the emulator has `emulator` and the real kube-apiserver `real` (the string `<absent>` for a
    key that is not there). Both are checked, so the table stays true; then the place is left out."""

    step: str
    path: tuple[Any, ...]
    emulator: Any
    real: Any
    why: str


ABSENT = "<absent>"


def _pop(tree: Any, path: tuple[Any, ...]) -> Any:
    node = tree
    for p in path[:-1]:
        try:
            node = node[p]
        except (KeyError, IndexError, TypeError):
            return ABSENT
    try:
        value = node[path[-1]]
    except (KeyError, IndexError, TypeError):
        return ABSENT
    del node[path[-1]]
    return value


# --- the pair ---------------------------------------------------------------------------------------------------

Case = Callable[[Backend], Awaitable[Mapping[str, Any]]]


class Pair:
    """The emulator and the real kube-apiserver, side by side."""

    def __init__(self, emulator: Backend, real: Backend) -> None:
        self.emulator = emulator
        self.real = real

    async def run(self, case: Case, *, volatile: tuple[str, ...] = (), deliberate: tuple[Deliberate, ...] = (),
                  bodies: bool = True) -> dict[str, tuple[Any, Any]]:
        """Run `case` on both backends and compare every step; returns {step: (emulator's, real's)} reduced."""
        vol = frozenset(volatile)
        got: dict[str, dict] = {}
        raw: dict[str, Mapping[str, Any]] = {}
        for b in (self.emulator, self.real):
            steps = await case(b)
            raw[b.name] = steps
            got[b.name] = {k: _reduce_any(v, b, vol, bodies) for k, v in steps.items()}
        emu, real = got[self.emulator.name], got[self.real.name]
        problems: list[str] = []
        for d in deliberate:
            e_val = _pop(emu.get(d.step), d.path)
            r_val = _pop(real.get(d.step), d.path)
            if e_val != d.emulator or r_val != d.real:
                problems.append(f"the deliberate difference at {d.step}{list(d.path)} ({d.why}) is no longer as "
                                f"documented: emulator {json.dumps(e_val)[:300]} (documented "
                                f"{json.dumps(d.emulator)[:300]}), real {json.dumps(r_val)[:300]} (documented "
                                f"{json.dumps(d.real)[:300]}); update lab/README.md and the case")
        for step in emu:
            for line in differences(emu[step], real.get(step)):
                problems.append(f"{step}: {line}")
        if problems:
            shown = "\n".join(f"--- {step}\nemulator: {json.dumps(emu[step], indent=1, sort_keys=True)}\n"
                              f"real:     {json.dumps(real.get(step), indent=1, sort_keys=True)}" for step in emu)
            raise AssertionError("the emulator and the real kube-apiserver answer differently:\n  " +
                                 "\n  ".join(problems) + "\n" + shown)
        return {k: (emu[k], real[k]) for k in emu}


def _reduce_any(value: Any, b: Backend, vol: frozenset[str], bodies: bool) -> Any:
    if isinstance(value, Answer):
        return reduce_answer(value, b, volatile=vol, body=bodies)
    return normalise(value, b, volatile=vol)


@contextlib.asynccontextmanager
async def opened(*backends: Backend):
    for b in backends:
        await b.open()
    try:
        yield
    finally:
        for b in backends:
            await b.close()
