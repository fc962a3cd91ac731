"""Kubernetes API errors as the emulator answers them: a meta/v1 Status with the code, reason and message."""

from __future__ import annotations

# HTTP code to the Status reason kube-apiserver uses when the caller gives none.
_DEFAULT_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    504: "Timeout",
}


class ApiError(Exception):
    """An error answer of the API: raised anywhere in a handler, rendered once as a Status."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        # None: the Status carries no reason at all (kube-apiserver's answer to some internal errors).
        self.reason = "" if reason is None else reason or _DEFAULT_REASONS.get(code, "Unknown")
        self.message = message
        self.details = details

    def status(self) -> dict:
        out = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:
            del out["reason"]
        if self.details is not None:
            out["details"] = self.details
        return out

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"


def resource_label(group: str, plural: str) -> str:
    """How kube-apiserver names a resource in messages: `clusterpeers.peering.deckhouse.io`, `configmaps`."""
    return f"{plural}.{group}" if group else plural


def details(name: str, group: str, kind: str, **more) -> dict:
    """A Status's details as kube-apiserver fills them: empty fields (the core group, no name) are left out."""
    out = {k: v for k, v in (("name", name), ("group", group), ("kind", kind)) if v}
    out.update(more)
    return out


def not_found(group: str, plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource_label(group, plural)} "{name}" not found',
                    details(name, group, plural))


def already_exists(group: str, plural: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{resource_label(group, plural)} "{name}" already exists',
                    details(name, group, plural))


def conflict(group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {resource_label(group, plural)} "{name}": {why}',
                    details(name, group, plural))


def precondition_failed(kind: str, group: str, name: str, field: str, wanted: str, recorded: str) -> ApiError:
    """A delete whose precondition (`field`: ResourceVersion or UID) does not hold. kube-apiserver names the
    resource by its kind here, unlike the update conflict."""
    why = ("The object might have been modified" if field == "ResourceVersion" else
           "The object might have been deleted and then recreated")
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {resource_label(group, kind)} "{name}": the {field} in the '
                    f"precondition ({wanted}) does not match the {field} in record ({recorded}). {why}",
                    details(name, group, kind))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(kind: str, group: str, name: str, causes: list[dict]) -> ApiError:
    """422 Invalid naming every failing field, in kube-apiserver's message form.

    Each cause is {"reason": "FieldValue...", "message": "...", "field": "spec.x"}.
    """
    qualified = f"{kind}.{group}" if group else kind
    # The message lists each distinct error once (Go's ErrorList.ToAggregate); the causes keep every one.
    parts = list(dict.fromkeys(f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes))
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {joined}',
                    details(name, group, kind, causes=causes))


class PageNotFound(ApiError):
    """A path no handler serves (an unknown resource or group): kube-apiserver's mux answers it in plain text,
    `404 page not found`, not with a Status."""

    def __init__(self) -> None:
        super().__init__(404, "NotFound", "404 page not found")


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
