"""The verdicts of `peering check`, as plain functions of what it read (`control.check.cluster.Facts`) and what
the network answered (`control.check.probes`): no I/O here, so every line and its fix is tested as a table.

A line fails (✗) when something is broken and says the fix; it warns (!) when the check cannot see something
with the caller's role, when the cluster is not shaped as Deckhouse shapes it (a lab), or when something is on its
way (an invite waiting for its join).
"""

from __future__ import annotations

import datetime

from contract import reasons
from contract.names import CA_SECRET, EGRESS_TLS_SECRET, ENTRANCE_TLS_SECRET
from contract.peer_secret import PeerCredentials
from control import pki
from control.check.cluster import DEPLOYMENT, FORBIDDEN, MISSING, UNSERVED, Facts, Read
from control.check.report import Line, fail, ok, warn
from control.config import ControlSettings
from control.connstring import format_time
from control.rules import conditions as cond
from control.rules import credentials as creds
from control.rules.events import duration
from control.rules.invite import parse_time
from control.selfcheck import Probe

GOOD_HTTPS_MODES = ("CertManager", "CustomCertificate")


def _cant_read(check: str, what: str, read: Read, **kw) -> Line:
    if read.state == FORBIDDEN:
        return warn(check, f"{what} cannot be read with this role ({read.detail or 'forbidden'})",
                    "run the check as an administrator who may read it to see this line", reason="Forbidden", **kw)
    return warn(check, f"{what} could not be read: {read.detail}", "run the check again; check the API server",
                reason="ReadFailed", **kw)


def micro_time(text) -> datetime.datetime | None:
    """A meta/v1 MicroTime (or Time) as a datetime; None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    return parse_time(text.rstrip("Z").split(".")[0] + "Z")


def ago(now: datetime.datetime, then: datetime.datetime | None) -> str:
    return f"{duration((now - then).total_seconds())} ago" if then is not None else "at an unknown time"


# --- the module ---------------------------------------------------------------------------------------------------

def module_line(f: Facts) -> Line:
    if f.module.state == UNSERVED:
        if f.module_namespace.state == MISSING:
            return fail("module", f"the namespace {f.namespace} does not exist",
                        "enable the module: a ModuleConfig `peering` with spec.enabled: true", reason="ModuleDisabled")
        return warn("module", "this API server serves no Module objects (deckhouse.io/v1alpha1 modules): not a "
                              f"Deckhouse cluster, or a lab cluster; the module is judged by its namespace {f.namespace}, "
                              "its Lease and its objects below", reason="NoModuleAPI")
    if f.module.state == MISSING:
        return fail("module", "Deckhouse has no module `peering`", "check the Deckhouse release: `d8 k get modules`",
                    reason="ModuleMissing")
    if not f.module.ok:
        return _cant_read("module", "Module peering", f.module)
    status = f.module.obj.get("status") or {}
    phase = status.get("phase") or "Unknown"
    if phase == "Ready":
        return ok("module", "Module peering is Ready")
    why = "; ".join(str(c.get("message")) for c in status.get("conditions") or []
                    if isinstance(c, dict) and c.get("status") != "True" and c.get("message"))
    return fail("module", f"Module peering is {phase}" + (f": {why}" if why else ""),
                "enable it with a ModuleConfig `peering` (spec.enabled: true); it needs user-authn enabled; "
                "`d8 k get module peering -o yaml` says more", reason="ModuleNotReady")


def _pod_problem(pod: dict) -> str | None:
    status = pod.get("status") or {}
    ready = cond.get_condition(status.get("conditions"), "Ready") or {}
    if ready.get("status") == "True":
        return None
    for c in status.get("containerStatuses") or []:
        state = c.get("state") or {}
        for kind in ("waiting", "terminated"):
            if kind in state:
                reason = state[kind].get("reason") or kind
                return f"{reason}" + (f" ({c.get('restartCount')} restarts)" if c.get("restartCount") else "")
    return status.get("phase") or "not Ready"


def replica_lines(f: Facts) -> tuple[list[Line], list[str] | None]:
    """The Deployment's replicas and their Pods; also the names of the running Pods (None: not known)."""
    d = f.deployment
    if d.state == UNSERVED:
        return [warn("replicas", "this API server serves no Deployments (apps/v1): a lab cluster, whose peering "
                                 "process runs outside the API; the replicas are judged by the Lease (next line), "
                                 "which only a running replica renews", reason="NoDeploymentAPI")], None
    if d.state == MISSING:
        return [fail("replicas", f"the Deployment {f.namespace}/{DEPLOYMENT} does not exist",
                     "enable the module (ModuleConfig `peering`, spec.enabled: true) and wait for Deckhouse to "
                     "install it", reason="NoDeployment")], None
    if not d.ok:
        return [_cant_read("replicas", f"the Deployment {f.namespace}/{DEPLOYMENT}", d)], None
    desired = (d.obj.get("spec") or {}).get("replicas", 1)
    ready = (d.obj.get("status") or {}).get("readyReplicas") or 0
    if not f.pods.ok:
        line = _cant_read("replicas", "the module's Pods", f.pods)
        if ready < desired:
            line = fail("replicas", f"{ready} of {desired} replicas are ready", "`d8 k -n d8-peering get pods`",
                        reason="ReplicasNotReady")
        return [line], None
    pods = sorted(f.pods.items, key=lambda p: p["metadata"]["name"])
    problems = {p["metadata"]["name"]: why for p in pods if (why := _pod_problem(p)) is not None}
    running = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] not in problems]
    if ready >= desired and not problems:
        return [ok("replicas", f"{ready} of {desired} replicas ready: {', '.join(running)}")], running
    detail = ", ".join(f"{name} {why}" for name, why in problems.items()) or "no Pod yet"
    first = next(iter(problems), "<pod>")
    return [fail("replicas", f"{ready} of {desired} replicas ready; not ready: {detail}",
                 f"`d8 k -n {f.namespace} describe pod {first}` and `d8 k -n {f.namespace} logs {first} -c peering`",
                 reason="ReplicasNotReady")], running


def leader_line(f: Facts, running: list[str] | None) -> Line:
    if f.lease.state == MISSING:
        return fail("leader", f"there is no Lease {f.namespace}/peering: no replica has ever led",
                    "check that the module's Pods run and may write Leases in the namespace", reason="NoLeader")
    if not f.lease.ok:
        return _cant_read("leader", f"the Lease {f.namespace}/peering", f.lease)
    spec = f.lease.obj.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    renewed = micro_time(spec.get("renewTime"))
    lasts = float(spec.get("leaseDurationSeconds") or 15)
    if not holder:
        return fail("leader", "the Lease has no holder: no replica leads, nothing is reconciled",
                    "check the module's Pods and their logs (`grep -i lease`)", reason="NoLeader")
    age = (f.now - renewed).total_seconds() if renewed is not None else None
    if age is None or age > lasts + 5:
        return fail("leader", f"the Lease was last renewed {ago(f.now, renewed)} by {holder}, longer ago than its "
                              f"{lasts:.0f} s: no replica leads now, nothing is reconciled",
                    "check the module's Pods: the leader may have died without releasing it, or cannot reach the "
                    "API server", reason="LeaseExpired")
    if running is not None and holder not in running:
        return warn("leader", f"held by {holder}, renewed {duration(age)} ago, which is not a ready Pod of the "
                              "Deployment", "check the module's Pods", reason="LeaderNotAPod")
    return ok("leader", f"held by {holder}, renewed {duration(age)} ago (a leader renews every 2 s)")


def https_lines(f: Facts, join_host: str, join) -> list[Line]:
    """`https.mode` (from the ModuleConfigs when readable) and what the join endpoint serves."""
    out: list[Line] = []
    module_mode = (((f.module_config.obj or {}).get("spec") or {}).get("settings") or {}).get("https", {}) \
        .get("mode") if f.module_config.ok else None
    global_mode = ((((f.global_config.obj or {}).get("spec") or {}).get("settings") or {}).get("modules") or {}) \
        .get("https", {}).get("mode") if f.global_config.ok else None
    mode, where = (module_mode, "ModuleConfig peering") if module_mode else (global_mode, "global.modules")
    if mode is None and f.global_config.ok:
        mode, where = "CertManager", "Deckhouse's default"
    if mode is None:
        read = f.global_config if not f.global_config.ok else f.module_config
        why = ("this API server serves no ModuleConfigs (a lab cluster)" if read.state == UNSERVED else
               f"the ModuleConfigs cannot be read ({read.state})")
        out.append(warn("https", f"https.mode is not known: {why}; the join endpoint's line shows what it serves",
                        "run the check as an administrator who may read ModuleConfig global", reason="HttpsModeUnknown"))
    elif mode not in GOOD_HTTPS_MODES:
        out.append(fail("https", f"https.mode is {mode} ({where}): the join endpoint needs TLS",
                        "set global.modules.https.mode (or https.mode of ModuleConfig peering) to CertManager or "
                        "CustomCertificate", reason="HttpsModeUnusable"))
    elif mode is not None:
        out.append(ok("https", f"https.mode is {mode} ({where})"))
    url = f"https://{join_host}/v1/join"
    if join.status == 405:
        out.append(ok("join endpoint", f"{url} serves TLS trusted here and answers as the module's join listener"))
    elif join.untrusted:
        issuer = ""
        if join.cert_pem:
            try:
                issuer = f" (issued by {pki.load_cert(join.cert_pem).issuer.rfc4514_string()})"
            except pki.PKIError:
                pass
        out.append(warn("join endpoint", f"the certificate of {join_host} is not trusted here{issuer}: "
                                         f"{join.untrusted}",
                        "with CertManager, check the Certificate d8-peering/peering-join; with CustomCertificate of "
                        "a private CA, other clusters trust it only through the connection string, which carries "
                        "it", reason="JoinCertificateUntrusted"))
    elif join.status is None:
        out.append(fail("join endpoint", f"{url} does not answer from here: {join.error}",
                        f"check the DNS record of {join_host} and the ingress controller in front of the module",
                        reason="JoinEndpointUnreachable"))
    else:
        reason = join.body.get("reason") if isinstance(join.body, dict) else ""
        out.append(fail("join endpoint", f"{url} answered HTTP {join.status}" + (f" ({reason})" if reason else "")
                        + ", not as the module's join listener",
                        "check the Ingress d8-peering/peering-join and that the module's Pods are ready (503: no "
                        "endpoints)", reason="JoinEndpointMisrouted"))
    return out


def dns_lines(resolved) -> list[Line]:
    out = []
    for r in resolved:
        if r.error:
            out.append(fail("dns", f"{r.host} does not resolve: {r.error}",
                            f"create the DNS record of {r.host} (peering: the ingress controller; peering-gateway: "
                            "the entrance's LoadBalancer or SSL-passthrough ingress), reachable from the other "
                            "clusters", reason="NameNotResolved"))
        else:
            via = " (--resolve)" if r.via == "override" else ""
            out.append(ok("dns", f"{r.host} resolves to {', '.join(r.addresses)}{via}"))
    return out


def cluster_ca(f: Facts) -> str | None:
    """This cluster's peering CA, from the CA Secret when readable, else from an established peering's access."""
    values = creds.secret_values(f.module_secrets.get(CA_SECRET, Read(UNSERVED)).obj)
    if values.get("tls.crt"):
        return values["tls.crt"]
    for cp in f.clusterpeers.items:
        bundle = ((cp.get("status") or {}).get("access") or {}).get("caBundle")
        if isinstance(bundle, str) and bundle.strip():
            return bundle
    return None


def entrance_lines(f: Facts, host: str, probe: Probe) -> list[Line]:
    """The self-check's two conditions as seen from here, and the module's own self-check from its ClusterPeers."""
    client = cond.client_cert_condition(probe.client, probe.detail)
    out = []
    if client.status == "True":
        out.append(ok("entrance", f"{host} refuses a connection without a client certificate (ClientCertRequired)"))
    elif client.reason == cond.CLIENT_CERT_NOT_REQUIRED:
        out.append(fail("entrance", f"{host} answered a request without a client certificate: something in front of "
                                    "it terminates TLS", "pass connections to peering-gateway.<domain> without TLS "
                                    "decryption: a LoadBalancer Service, or an ingress-nginx controller with an "
                                    "SSL-passthrough inlet", reason=client.reason))
    else:
        out.append(fail("entrance", f"{host} cannot be reached from here: {probe.detail or 'no connection'}",
                        "check that it resolves to the entrance (the LoadBalancer Service d8-peering/peering-entrance "
                        "or the SSL-passthrough ingress) and that port 443 is open to the other clusters",
                        reason=client.reason))
    ca = cluster_ca(f)
    if probe.cert_pem and ca:
        server = cond.server_cert_condition(probe.cert_pem, ca, host, f.now)
        until = format_time(pki.not_after(probe.cert_pem)) if server.status == "True" else ""
        out.append(ok("entrance certificate", f"the peering CA's certificate for {host}, valid until {until}")
                   if server.status == "True" else
                   fail("entrance certificate", server.message.rpartition(". ")[0], server.message.rpartition(". ")[2],
                        reason=server.reason))
    elif probe.cert_pem:
        out.append(warn("entrance certificate", "no peering CA to compare the served certificate with (no peering "
                                                "established and the CA Secret not readable with this role)",
                        "run the check as an administrator, or once a peering is established", reason="NoCA"))
    own = _self_check(f)
    if own is not None:
        out.append(own)
    return out


def _self_check(f: Facts) -> Line | None:
    for type_ in (cond.CLIENT_CERT_ENFORCED, cond.SERVER_CERT_OURS):
        for cp in f.clusterpeers.items:
            c = cond.get_condition((cp.get("status") or {}).get("conditions"), type_)
            if c is not None and c.get("status") != "True":
                return fail("self-check", f"the module's own probe of its entrance: {type_} {c.get('status')}: "
                                          f"{c.get('message')}", "pass connections to peering-gateway.<domain> "
                                          "without TLS decryption, to the module's entrance",
                            reason=c.get("reason", ""))
    if f.clusterpeers.items:
        return ok("self-check", "the module's own probe of its entrance finds it enforcing client certificates "
                                "with its own certificate (ClientCertEnforced, ServerCertOurs)")
    return None


def certificate_text(pem: str, now: datetime.datetime) -> tuple[str, str]:
    """(status, text) of one certificate: "expired", "overdue" (past half of its renewal window) or "ok"."""
    end, renew = pki.not_after(pem), pki.renewal_time(pem)
    if end <= now:
        return "expired", f"expired at {format_time(end)}"
    if now >= renew + (end - renew) / 2:
        return "overdue", f"valid until {format_time(end)}, its renewal due since {format_time(renew)} has not happened"
    return "ok", f"valid until {format_time(end)} (renewal at {format_time(renew)})"


def module_certificates_line(f: Facts) -> Line:
    parts, worst = [], "ok"
    for name, label in ((ENTRANCE_TLS_SECRET, "entrance"), (EGRESS_TLS_SECRET, "egress"), (CA_SECRET, "CA")):
        read = f.module_secrets.get(name, Read(UNSERVED))
        if not read.ok:
            return _cant_read("module certificates", f"the Secret {f.namespace}/{name}", read)
        pem = creds.secret_values(read.obj).get("tls.crt")
        if not pem:
            return fail("module certificates", f"the Secret {f.namespace}/{name} holds no certificate",
                        "the leader issues it: see the leader line", reason="CertificateMissing")
        state, text = certificate_text(pem, f.now)
        if label == "CA":  # never renewed while usable: every peering depends on it
            text = text.split(" (renewal")[0]
        parts.append(f"{label} {text}")
        worst = state if state == "expired" or (state == "overdue" and worst == "ok") else worst
    message = "; ".join(parts)
    if worst == "expired":
        return fail("module certificates", message, "the leader renews them: see the leader line and its log",
                    reason=reasons.CERTIFICATE_EXPIRED)
    if worst == "overdue":
        return warn("module certificates", message, "the leader renews them: see the leader line and its log",
                    reason="RenewalOverdue")
    return ok("module certificates", message)


#: The ModuleConfig's settings of the lifetimes and the process's environment variables the Deployment sets them in.
LIFETIME_SETTINGS = (("server", "serverCertificateLifetimeSeconds", "PEERING_SERVER_CERT_LIFETIME",
                      "--server-cert-lifetime"),
                     ("client", "clientCertificateLifetimeSeconds", "PEERING_CLIENT_CERT_LIFETIME",
                      "--client-cert-lifetime"))


def _configured(container: dict, env_name: str, flag: str) -> float | None:
    args = [str(a) for a in container.get("args") or []]
    env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
    text = args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else env.get(env_name)
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _issued_for(pem: str | None) -> float | None:
    """How long a certificate was issued for (seconds), from its dates; None when there is none to read."""
    if not pem:
        return None
    try:
        return (pki.not_after(pem) - pki.issued_at(pem)).total_seconds()
    except pki.PKIError:
        return None


def lifetimes_line(f: Facts, container: dict) -> Line:
    """The certificate lifetimes this cluster works with: as the Deployment runs the process (the ModuleConfig's
    settings), else as the certificates it issued show them."""
    defaults = {"server": ControlSettings.server_cert_lifetime, "client": ControlSettings.client_cert_lifetime}
    seen: dict[str, tuple[float, str]] = {}
    for kind, setting, env_name, flag in LIFETIME_SETTINGS:
        value = _configured(container, env_name, flag)
        if value is not None:
            seen[kind] = (value, f"{setting} of ModuleConfig peering, through the Deployment")
        elif container:
            seen[kind] = (defaults[kind], f"the default; set {setting} in ModuleConfig peering to change it")
    if "server" not in seen:
        issued = _issued_for(creds.secret_values(f.module_secrets.get(ENTRANCE_TLS_SECRET, Read(UNSERVED)).obj)
                             .get("tls.crt"))
        if issued is not None:
            seen["server"] = (issued, "as the entrance certificate was issued")
    if "client" not in seen:
        newest = [_issued_for(PeerCredentials.from_secret(r.obj).issued or None)
                  for r in f.peer_secrets.values() if r.ok]
        issued = next((s for s in newest if s is not None), None)
        if issued is not None:
            seen["client"] = (issued, "as the certificates issued to peers were")
    if not seen:
        return warn("certificate lifetimes", "the Deployment and the module's certificates cannot be read with this "
                                             "role (or there are none yet)", "run the check as an administrator who "
                                             "may read them to see the lifetimes", reason="Forbidden")
    words = {"server": "entrance and egress certificates", "client": "client certificates issued to peers"}
    parts = [f"{words[k]} live {duration(v)} ({source})" for k, (v, source) in sorted(seen.items(), reverse=True)]
    return ok("certificate lifetimes", "; ".join(parts) + ". Each is renewed at half of its lifetime; a client "
              "certificate that expires while its peer is unreachable is renewed once the peer is back")
