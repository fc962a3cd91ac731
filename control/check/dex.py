"""The verdicts of `peering check` on user-authn and Dex (pure): the user-authn module, Dex's discovery document,
whether Dex has its `kubernetes` client, and whether Dex accepts the module's client at its token endpoint.

Dex's `kubernetes` client is the audience kube-apiserver accepts, and every exchange the gateway makes asks for it
(scope `audience:server:client_id:kubernetes`). user-authn renders it only while its `publishAPI.enabled` is on,
its `kubeconfigGenerator` has an entry, or a DexAuthenticator has `spec.allowAccessToKubernetes`; `publishAPI` is
off by default. Without it Dex answers every exchange with 500 `server_error`, and no consumer of a peer gets in.
"""

from __future__ import annotations

from control.check.cluster import FORBIDDEN, MISSING, UNSERVED, Facts, Read
from control.check.report import Line, fail, ok, warn
from control.rules import credentials as creds

NO_KUBERNETES_CLIENT = "NoKubernetesClient"
#: The way to give Dex its `kubernetes` client.
PUBLISH_API_FIX = ("enable publishAPI of user-authn: `d8 k patch moduleconfig user-authn --type=merge -p "
                   "'{\"spec\":{\"version\":2,\"settings\":{\"publishAPI\":{\"enabled\":true}}}}'` (or give it a "
                   "kubeconfigGenerator entry); Dex has its `kubernetes` client within a minute")


def _forbidden(check: str, what: str, read: Read) -> Line:
    if read.state == FORBIDDEN:
        return warn(check, f"{what} cannot be read with this role ({read.detail or 'forbidden'})",
                    "run the check as an administrator who may read it to see this line", reason="Forbidden")
    return warn(check, f"{what} could not be read: {read.detail}", "run the check again; check the API server",
                reason="ReadFailed")


def kubernetes_client_reasons(f: Facts) -> list[str]:
    """What gives Dex its `kubernetes` client here (empty: nothing does)."""
    settings = ((f.user_authn_config.obj or {}).get("spec") or {}).get("settings") or {} \
        if f.user_authn_config.ok else {}
    publish = settings.get("publishAPI") if isinstance(settings.get("publishAPI"), dict) else {}
    out = []
    if publish.get("enabled") is True:
        out.append("publishAPI is enabled in ModuleConfig user-authn")
    if settings.get("kubeconfigGenerator"):
        out.append("ModuleConfig user-authn has kubeconfigGenerator entries")
    for da in f.dex_authenticators.items:
        if (da.get("spec") or {}).get("allowAccessToKubernetes") is True:
            meta = da.get("metadata") or {}
            out.append(f"DexAuthenticator {meta.get('namespace')}/{meta.get('name')} allows access to Kubernetes")
    return out


def kubernetes_client_line(f: Facts) -> Line:
    """Whether Dex has the `kubernetes` client every exchange asks for."""
    check = "dex audience"
    config = f.user_authn_config
    if config.state == UNSERVED:
        return warn(check, "this API server serves no ModuleConfigs, so whether Dex has its `kubernetes` client "
                           "(the audience of every exchange) is not known here", PUBLISH_API_FIX,
                    reason="KubernetesClientUnknown")
    found = kubernetes_client_reasons(f)
    if found:
        return ok(check, "Dex has its `kubernetes` client, the audience kube-apiserver accepts: " + "; ".join(found))
    if not config.ok and config.state != MISSING:
        return _forbidden(check, "ModuleConfig user-authn (whether Dex has its `kubernetes` client)", config)
    if f.dex_authenticators.state not in (MISSING, UNSERVED) and not f.dex_authenticators.ok:
        return _forbidden(check, "the DexAuthenticators (one allowed access to Kubernetes gives Dex its `kubernetes` "
                                 "client)", f.dex_authenticators)
    where = "ModuleConfig user-authn leaves publishAPI off" if config.ok else "there is no ModuleConfig user-authn"
    return fail(check, f"Dex has no `kubernetes` client: {where}, it has no kubeconfigGenerator entry and no "
                       "DexAuthenticator allows access to Kubernetes, and only these make user-authn create it. "
                       "Every token exchange of the peers' consumers fails with Dex's 500 server_error",
                PUBLISH_API_FIX, reason=NO_KUBERNETES_CLIENT)


def _module_line(f: Facts) -> list[Line]:
    if f.user_authn.ok:
        phase = (f.user_authn.obj.get("status") or {}).get("phase") or "Unknown"
        return [ok("user-authn", "Module user-authn is Ready") if phase == "Ready" else
                fail("user-authn", f"Module user-authn is {phase}", "enable user-authn (ModuleConfig `user-authn`, "
                     "spec.enabled: true): the peering module requires it", reason="UserAuthnNotReady")]
    if f.user_authn.state == MISSING:
        return [fail("user-authn", "Deckhouse has no module user-authn", "check the Deckhouse release",
                     reason="UserAuthnMissing")]
    return []


def user_authn_lines(f: Facts, dex_url: str, dex, token=None, client_id: str = "") -> list[Line]:
    """The user-authn module, Dex's discovery (`dex`, an Https), its `kubernetes` client, and the module's client
    as Dex's token endpoint judged it (`token`, an Https of `probes.dex_token`; None when not asked)."""
    out = _module_line(f)
    if f.providers_served is False:
        out.append(fail("user-authn", "the API server does not serve tokenexchangeproviders.deckhouse.io: user-authn "
                                      "is disabled, or has no TokenExchangeProvider support, so Dex cannot exchange "
                                      "the peers' tokens", "enable user-authn at a version that serves "
                                      "TokenExchangeProvider", reason="UserAuthnMissing"))
    elif f.providers_served and not f.user_authn.ok:
        out.append(ok("user-authn", "TokenExchangeProviders are served (no Module API here: judged by user-authn's "
                                    "API)"))
    body = dex.body if isinstance(dex.body, dict) else {}
    if dex.status == 200 and body.get("token_endpoint"):
        out.append(ok("dex", f"Dex answers at {dex_url} (issuer {body.get('issuer')})"))
    elif dex.untrusted:
        out.append(fail("dex", f"the certificate of Dex at {dex_url} is not trusted here: {dex.untrusted}",
                        "the module must trust it too: check user-authn's certificate (https.mode)",
                        reason="DexUntrusted"))
    else:
        got = f"HTTP {dex.status}" if dex.status is not None else dex.error
        out.append(fail("dex", f"Dex does not answer its discovery document at {dex_url}: {got}",
                        "check user-authn's Dex (`d8 k -n d8-user-authn get pods`) and the DNS record of dex.<domain>",
                        reason="DexUnreachable"))
    out.append(kubernetes_client_line(f))
    out.append(dex_client_line(f, token, client_id))
    return out


def _answer(token) -> tuple[str, str]:
    body = token.body if isinstance(token.body, dict) else {}
    return str(body.get("error") or ""), str(body.get("error_description") or "")


def dex_client_line(f: Facts, token, client_id: str) -> Line:
    """The Secret of the module's Dex client, and whether Dex's token endpoint accepts that client now."""
    secret = f.dex_secret
    name = f"{f.namespace}/dex-client-peering"
    if secret.state == MISSING:
        return fail("dex client", f"there is no Secret {name}: token exchange fails",
                    "user-authn writes it for the DexClient d8-peering/peering (`d8 k -n d8-peering get dexclient "
                    "peering`); check that user-authn is enabled", reason="NoDexSecret")
    if not secret.ok:
        line = _forbidden("dex client", f"the Secret {name} (the viewer role reads no Secrets)", secret)
        error, _ = _answer(token) if token is not None else ("", "")
        if token is not None and token.status == 401 and error == "invalid_client":
            line = warn(line.check, line.message + "; Dex's token endpoint answers (401 invalid_client without "
                                                   "credentials), whether it accepts the module's client is not known",
                        line.fix, reason=line.reason)
        return line
    if not creds.secret_values(secret.obj).get("clientSecret"):
        return fail("dex client", f"the Secret {name} has no clientSecret",
                    "user-authn writes it from the DexClient d8-peering/peering: check both", reason="NoDexSecret")
    if token is None:
        return ok("dex client", f"the Secret {name} holds the module's client secret")
    error, description = _answer(token)
    if token.status == 400 and error == "invalid_request":
        return ok("dex client", f"Dex's token endpoint accepts the module's client {client_id} (a request without a "
                                f"token was refused after it: {description or error})")
    if token.status == 401 and error == "invalid_client":
        return fail("dex client", f"Dex's token endpoint does not accept the module's client {client_id} with the "
                                  f"secret of {name} (401 invalid_client): every token exchange fails",
                    "user-authn makes the client and its Secret from the DexClient d8-peering/peering: check that "
                    "it exists and user-authn runs; the module reads the Secret again on each exchange",
                    reason="DexClientRefused")
    if token.status is None:
        return fail("dex client", f"Dex's token endpoint does not answer: {token.untrusted or token.error}",
                    "check user-authn's Dex (`d8 k -n d8-user-authn get pods`) and the DNS record of dex.<domain>",
                    reason="DexUnreachable")
    return fail("dex client", f"Dex's token endpoint answered HTTP {token.status} {error} {description}".rstrip()
                + " to a request without a token, not as Dex does",
                "check that dex.<domain> is user-authn's Dex", reason="DexUnexpectedAnswer")
