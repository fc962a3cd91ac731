"""A token request's fields as Dex reads them: Go's net/http form parsing and HTTP Basic credentials.

Dex's `handleToken` calls `r.ParseForm()` and then reads `grant_type`, `client_id` and `client_secret` with
`r.PostFormValue` (the body only) and the token exchange's own fields with `r.Form.Get` (the body's first value,
else the query's). Go parses, and this does the same:

- the body only when its Content-Type is `application/x-www-form-urlencoded` (no Content-Type is
  `application/octet-stream`; a `multipart/form-data` body is not read by ParseForm, so its fields are absent);
- a Content-Type that `mime.ParseMediaType` refuses (no type, a parameter without a value, a parameter twice),
  a body over 10 MiB, more than 10,000 fields, a `;` in a field, a `%` not followed by two hex digits, in the
  body or in the query: the request cannot be parsed, and Dex answers 400 `invalid_request` (no description);
- values are bytes after unescaping (`+` is a space); they are kept as `str` decoded from UTF-8 with
  `surrogateescape`, so that two values are equal exactly when their bytes are.

Credentials: `r.BasicAuth()` (the scheme in any case, standard base64, split at the first colon; anything else
is no Basic credential), then `url.QueryUnescape` of each (RFC 6749 §2.3.1).
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse
from dataclasses import dataclass, field

FORM_URLENCODED = "application/x-www-form-urlencoded"
# Go's parsePostForm reads at most this much of a body (`10 << 20`, "10 MB is a lot of text").
MAX_FORM_BYTES = 10 << 20
# net/url's defaultMaxParams: ParseQuery refuses more fields than this.
MAX_FORM_FIELDS = 10000
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")
# RFC 2045 token characters, as Go's mime.isTokenChar: printable ASCII but tspecials.
_TOKEN = re.compile(r"[!#$%&'*+\-.0-9A-Z^_`a-z|~]+")
_TSPECIALS = '()<>@,;:\\"/[]?='



class FormError(ValueError):
    """The request's form cannot be parsed (Dex: 400 invalid_request); the message says why, for the log."""


def query_unescape(value: bytes) -> str:
    """Go's url.QueryUnescape: `+` is a space, `%XX` a byte; a broken escape is FormError."""
    if _BAD_ESCAPE.search(value):
        raise FormError("invalid URL escape")
    return urllib.parse.unquote_to_bytes(value.replace(b"+", b" ")).decode("utf-8", "surrogateescape")


def parse_query(text: bytes) -> list[tuple[str, str]]:
    """Go's url.ParseQuery: `&`-separated `key=value` fields, empty ones skipped; a `;` in a field, a broken
    escape, or more than MAX_FORM_FIELDS fields is FormError."""
    if text.count(b"&") + 1 > MAX_FORM_FIELDS:
        raise FormError("number of URL query parameters exceeded limit")
    pairs = []
    for item in text.split(b"&"):
        if b";" in item:
            raise FormError("invalid semicolon separator in query")
        if item:
            key, _, value = item.partition(b"=")
            pairs.append((query_unescape(key), query_unescape(value)))
    return pairs


def _token(v: str) -> tuple[str, str]:
    m = _TOKEN.match(v)
    return (m.group(), v[m.end():]) if m else ("", v)


def _value(v: str) -> tuple[str, str]:
    """Go's mime.consumeValue: a token or a quoted-string (backslash escaping only tspecials)."""
    if not v.startswith('"'):
        return _token(v)
    out, i = [], 1
    while i < len(v):
        c = v[i]
        if c == '"':
            return "".join(out), v[i + 1:]
        if c == "\\" and i + 1 < len(v) and v[i + 1] in _TSPECIALS:
            out.append(v[i + 1])
            i += 2
            continue
        if c in "\r\n":
            break
        out.append(c)
        i += 1
    return "", v


def _param(v: str) -> tuple[str, str, str]:
    """Go's mime.consumeMediaParam: `; name=value` → (name, value, rest), or ("", "", v) when there is none."""
    rest = v.lstrip()
    if not rest.startswith(";"):
        return "", "", v
    name, rest = _token(rest[1:].lstrip())
    rest = rest.lstrip()
    if not name or not rest.startswith("="):
        return "", "", v
    rest = rest[1:].lstrip()
    value, after = _value(rest)
    if value == "" and after == rest:
        return "", "", v
    return name.lower(), value, after


def media_type(value: str) -> str:
    """Go's mime.ParseMediaType as parsePostForm uses it: the type, lower case; FormError where Go errs (no type,
    more than type/subtype, a parameter it cannot read, the same parameter twice with different values)."""
    base = value.partition(";")[0]
    mtype = base.strip().lower()
    typ, rest = _token(mtype)
    if not typ or (rest and not (rest.startswith("/") and _token(rest[1:])[0] and not _token(rest[1:])[1])):
        raise FormError(f"mime: bad media type {base!r}")
    params: dict[str, str] = {}
    v = value[len(base):]
    while v.strip():
        name, val, rest = _param(v)
        if not name:
            if rest.strip() == ";":
                break  # trailing semicolons are no error
            raise FormError(f"mime: invalid media parameter in {value!r}")
        if params.get(name, val) != val:
            raise FormError(f"mime: duplicate parameter name {name!r}")
        params[name] = val
        v = rest
    return mtype


@dataclass(frozen=True)
class Form:
    """`r.PostForm` (the body's fields) and the query's, as pairs in their order."""

    body: list[tuple[str, str]] = field(default_factory=list)
    query: list[tuple[str, str]] = field(default_factory=list)

    def post_value(self, key: str) -> str:
        """Go's r.PostFormValue: the body's first value, or ""."""
        return next((v for k, v in self.body if k == key), "")

    def value(self, key: str) -> str:
        """Go's r.Form.Get: the body's first value, else the query's first, or ""."""
        return next((v for k, v in self.body + self.query if k == key), "")


def reads_body(content_type: str | None) -> bool:
    """Whether ParseForm reads the body (form-urlencoded); FormError for a Content-Type Go refuses (then the
    body is not needed: the request is refused)."""
    return media_type(content_type or "application/octet-stream") == FORM_URLENCODED


def parse_form(content_type: str | None, body: bytes | None, raw_query: str) -> Form:
    """ParseForm of a POST: the body's fields when `body` is form-urlencoded, and the query's; FormError when Go's
    ParseForm fails. `body` None: it was not read (MAX_FORM_BYTES exceeded is the caller's FormError)."""
    mtype = media_type(content_type or "application/octet-stream")
    fields = parse_query(body or b"") if mtype == FORM_URLENCODED else []
    return Form(fields, parse_query(raw_query.encode("utf-8", "surrogateescape")))


def parse_basic_auth(header: str | None) -> tuple[str, str] | None:
    """HTTP Basic credentials, URL-unescaped as Dex does (RFC 6749 §2.3.1), or None when there are none.

    None (no Basic credentials: the form is read instead) follows Go's Request.BasicAuth: another scheme, bad
    base64 or no colon. A credential with a broken %-escape raises FormError naming it (`client_id` or
    `client_secret`), which Dex answers 400 `invalid_request` "<name> improperly encoded".
    """
    if not header or len(header) < 6 or header[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:], validate=True)
    except (binascii.Error, ValueError):
        return None
    if b":" not in decoded:
        return None
    user, _, password = decoded.partition(b":")
    out = []
    for what, value in (("client_id", user), ("client_secret", password)):
        try:
            out.append(query_unescape(value))
        except FormError:
            raise FormError(f"{what} improperly encoded") from None
    return out[0], out[1]
