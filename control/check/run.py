"""`peering check`: read the cluster, ask the network (every probe at once, each within `--timeout`), judge, and
print; exit 0 when healthy, 1 when not. What it says of the network is what answered now, not what the module's
last pass wrote: a peer that stopped answering a moment ago fails its line at once, and the line says that the
ClusterPeer's status is older.

Where the domain comes from, first found: `--public-domain-template`; the `--public-domain-template` argument of
the module's Deployment; `global.modules.publicDomainTemplate` of the ModuleConfig `global`. Dex's URL: `--dex-url`;
PEERING_DEX_URL of the Deployment; `https://dex.<domain>/`.
"""

from __future__ import annotations

from contract import reasons

import asyncio
from dataclasses import dataclass, field

from contract.names import NAMESPACE, dex_client_id
from contract.peer_secret import PeerCredentials
from control.check import dex as dex_lines, judge, peers
from control.check.cluster import ClusterReader, Facts
from control.check.consumer import ConsumerRequest, consumer_lines
from control.check.probes import TIMEOUT, dex_token, entrance, https_get, peer_offer, resolve
from control.check.report import Report, fail, warn
from control.clock import SYSTEM, Clock
from control.rules import credentials as creds
from control.config import check_domain_template
from control.kube import KubeSession
from gateway.resolve import OverrideResolver


@dataclass(frozen=True)
class Options:
    kubeconfig: str | None = None
    peer: str | None = None
    consumer: ConsumerRequest | None = None
    public_domain_template: str | None = None
    dex_url: str | None = None
    resolve: dict[str, str] = field(default_factory=dict)
    namespace: str = NAMESPACE
    #: Seconds each probe of the network may take.
    timeout: float = TIMEOUT


def domain_template(options: Options, f: Facts) -> tuple[str | None, str]:
    """The public domain template and where it came from."""
    if options.public_domain_template:
        return options.public_domain_template, "--public-domain-template"
    args = list(f.container().get("args") or [])
    if "--public-domain-template" in args and args.index("--public-domain-template") + 1 < len(args):
        return args[args.index("--public-domain-template") + 1], "the Deployment"
    settings = (((f.global_config.obj or {}).get("spec") or {}).get("settings") or {}) if f.global_config.ok else {}
    template = (settings.get("modules") or {}).get("publicDomainTemplate")
    if template:
        return template, "ModuleConfig global"
    return None, ""


def dex_url(options: Options, f: Facts, template: str) -> str:
    if options.dex_url:
        return options.dex_url
    env = {e.get("name"): e.get("value") for e in f.container().get("env") or [] if isinstance(e, dict)}
    return env.get("PEERING_DEX_URL") or f"https://{template % 'dex'}/"


def _dex_secret(f: Facts) -> str | None:
    """The module's Dex client secret when this role may read it, else None (Dex is then asked without it)."""
    return creds.secret_values(f.dex_secret.obj).get("clientSecret") if f.dex_secret.ok else None


async def _pull(options: Options, f: Facts, cp: dict):
    """The check's own offer pull from an established peering's peer; None when there is nothing to pull with."""
    if not peers.established(cp):
        return None
    secret = f.peer_secrets.get(cp["metadata"]["name"])
    values = PeerCredentials.from_secret(secret.obj if secret is not None and secret.ok else None)
    if not (values.peer_entrance and values.peer_ca and values.client_cert and values.client_key):
        return None
    return await peer_offer(values, options.resolve, timeout=options.timeout)


async def check(options: Options, *, clock: Clock = SYSTEM) -> Report:
    report = Report()
    resolver = OverrideResolver(options.resolve)
    try:
        kube = await KubeSession.connect(options.kubeconfig, resolver=resolver)
    except ValueError as exc:
        await resolver.close()
        report.add(fail("kubeconfig", str(exc), "give --kubeconfig or set KUBECONFIG", reason="NoKubeconfig"))
        return report
    try:
        return await _check(options, kube, report, clock)
    finally:
        await kube.close()
        await resolver.close()


async def _check(options: Options, kube: KubeSession, report: Report, clock: Clock) -> Report:
    reader = ClusterReader(kube, options.namespace)
    f = await reader.facts(clock.now(), peers=[options.peer] if options.peer else None)
    if not f.clusterpeers.ok:
        report.add(fail("api", f"the ClusterPeers cannot be read: {f.clusterpeers.state} {f.clusterpeers.detail}",
                        "check the kubeconfig and that the role may get and list clusterpeers (the module's viewer "
                        "role does)", reason="CannotRead"))
        return report
    report.add(judge.module_line(f))
    replicas, running = judge.replica_lines(f)
    report.add(*replicas, judge.leader_line(f, running))
    template, source = domain_template(options, f)
    if template is None:
        report.add(warn("domain", "the public domain template is not known here (no Deployment or ModuleConfig "
                                  "global to read it from)", "give --public-domain-template, e.g. %s.example.com",
                        reason="NoDomain"))
    else:
        try:
            check_domain_template(template)
        except ValueError as exc:
            report.add(fail("domain", str(exc), "give --public-domain-template, e.g. %s.example.com",
                            reason="InvalidDomain"))
            template = None
    selected = f.clusterpeers.items
    if options.peer:
        cp = f.clusterpeer(options.peer)
        selected = [cp] if cp is not None else []
    pulls = asyncio.gather(*(_pull(options, f, cp) for cp in selected))
    if template is not None:
        join_host, entrance_host = template % "peering", template % "peering-gateway"
        dex = dex_url(options, f, template)
        t = options.timeout
        resolved, join, probe, dex_answer, token, answers = await asyncio.gather(
            asyncio.gather(resolve(join_host, options.resolve, timeout=t),
                           resolve(entrance_host, options.resolve, timeout=t)),
            https_get(f"https://{join_host}/v1/join", options.resolve, timeout=t),
            entrance(entrance_host, options.resolve, timeout=t),
            https_get(dex.rstrip("/") + "/.well-known/openid-configuration", options.resolve, timeout=t),
            dex_token(dex.rstrip("/") + "/token", dex_client_id(namespace=options.namespace),
                      _dex_secret(f), options.resolve, timeout=t), pulls)
        report.add(*judge.https_lines(f, join_host, join), *judge.dns_lines(resolved),
                   *judge.entrance_lines(f, entrance_host, probe),
                   *dex_lines.user_authn_lines(f, dex, dex_answer, token, dex_client_id(namespace=options.namespace)))
    else:
        answers = await pulls
    report.add(judge.module_certificates_line(f), judge.lifetimes_line(f, f.container()))
    pulled = {cp["metadata"]["name"]: answer for cp, answer in zip(selected, answers)}
    if options.peer and not selected:
        report.add(fail(f"clusterpeer {options.peer}", f"there is no ClusterPeer {options.peer}",
                        "`d8 k get clusterpeers` lists the peerings of this cluster", reason=reasons.PEER_NOT_FOUND))
        return report
    elif not selected:
        report.add(warn("clusterpeers", "no ClusterPeer yet", "create one of type Invite to invite another cluster "
                                                             "(the guide's \"Creating an invitation\")",
                        reason="NoPeering"))
    for cp in sorted(selected, key=lambda c: c["metadata"]["name"]):
        report.add(*peers.peer_lines(f, cp, pulled.get(cp["metadata"]["name"])))
    if options.consumer is not None and options.peer:
        report.add(*await consumer_lines(kube, f.clusterpeer(options.peer), options.consumer, options.resolve))
    return report
