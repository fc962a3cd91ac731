"""The `peering` console script: `peering run` (the gateway and its control loop), `peering check` (is everything
a peering needs in place; also `kubectl peering check` through the `kubectl-peering` script), `peering kubeconfig`
and `peering version`.

Every flag can also come from the environment as PEERING_<FLAG> (upper case, dashes as underscores), which is how
the chart sets them; a flag given on the command line wins.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import asyncio
import datetime
import json
import logging
import os
import signal
import sys
from typing import Sequence

from control.config import ControlSettings, DexSettings, KubeSettings, LeaseSettings, ListenSettings, Settings
from control.version import version

log = logging.getLogger("peering.control.cli")

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
_SECRET_NAMES = {"token", "secret", "password", "authorization", "private_key", "key_pem", "client_secret"}
_SECRET_SUFFIXES = ("_token", "_secret", "_password", "_key_pem", "_private_key")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg and the record's `extra` fields.

    Extra fields whose name suggests a credential are replaced: code should never pass one, and if it does the
    value still does not reach the log."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name in _STANDARD or name.startswith("_"):
                continue
            lowered = name.lower()
            if lowered in _SECRET_NAMES or lowered.endswith(_SECRET_SUFFIXES):
                value = "<redacted>"
            line[name] = value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)
        if record.exc_info and record.exc_info[0] is not None:
            line["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        return json.dumps(line, default=str)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would log paths with queries; the gateway writes its own access log.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get("PEERING_" + name.upper().replace("-", "_"), default)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level; give one of {', '.join(LOG_LEVELS)}")
    return level


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; give a positive number such as 30")
    return value


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; give 0 to 65535 (0 lets the OS choose)")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number; give 0 to 65535 (0 lets the OS choose)")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate; give exchanges a second, such as 20 (0: no bound)")
    return value


def _burst(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a burst; give 1 or more exchanges, such as 200")
    return value


def _network(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IP address or CIDR; give the Ingress controller's "
                                         "pod addresses, such as 10.111.0.0/16") from None


def _env_networks() -> list[str]:
    """PEERING_TRUSTED_PROXIES (comma-separated), when no --trusted-proxy is given."""
    try:
        return [_network(p) for p in (_env("trusted-proxies") or "").split(",") if p.strip()]
    except argparse.ArgumentTypeError as err:
        raise SystemExit(f"PEERING_TRUSTED_PROXIES: {err}") from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of 1 or more")
    return value


def _check_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; give e.g. 5 or 2.5") from None
    if not 0.1 <= value <= 300:
        raise argparse.ArgumentTypeError(f"{text} seconds: give a probe from 0.1 to 300 seconds")
    return value


def _add_check(sub) -> None:
    ck = sub.add_parser("check", help="check everything the module and each peering depend on (read-only)",
                        description="Check, read-only with your kubeconfig, what the guide's Preparation and each "
                                    "peering depend on: the module and its replicas, the leader, https.mode, the "
                                    "peering and peering-gateway names, the entrance without TLS termination, "
                                    "user-authn and Dex, the Dex client's Secret, and per ClusterPeer its phase and "
                                    "Ready reason, last sync, certificates, TokenExchangeReady, capabilities and "
                                    "projects. One line per check (✓ works, ✗ broken with its fix, ! cannot tell or "
                                    "not done yet). Exit 0 when nothing is broken, 1 when something is. Needs the "
                                    "viewer role (Secrets are shown when readable); --consumer also creates a token.")
    ck.add_argument("--kubeconfig", default=_env("kubeconfig"), help="your kubeconfig (default: $KUBECONFIG)")
    ck.add_argument("--peer", help="check this ClusterPeer only (and the module)")
    ck.add_argument("--consumer", metavar="NS/SA",
                    help="prove a module's access end to end: a token of this ServiceAccount with the capability's "
                         "audience, and a request with it through both gateways (needs --peer and --capability)")
    ck.add_argument("--capability", help="with --consumer: the PeeringCapability the controller uses")
    ck.add_argument("--verb", help="with --consumer: list (default), get, watch are made; any other verb is asked "
                                   "as a SelfSubjectAccessReview, so nothing is written")
    ck.add_argument("--resource", help="with --consumer: RESOURCE or RESOURCE.GROUP, as kubectl names it")
    ck.add_argument("--namespace", help="with --consumer: the namespace on the peer")
    ck.add_argument("--name", help="with --consumer --verb get: the object's name")
    ck.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")
    ck.add_argument("--public-domain-template", help="the cluster's public domain template (default: read from the "
                                                     "module's Deployment or ModuleConfig global)")
    ck.add_argument("--dex-url", help="this cluster's Dex (default: the Deployment's, else https://dex.<domain>/)")
    ck.add_argument("--resolve", action="append", default=[], metavar="HOST=IP:PORT",
                    help="send connections to HOST to IP:PORT (repeatable): a lab's names, a port-forward")
    ck.add_argument("--timeout", type=_check_timeout, default=5.0, metavar="SECONDS",
                    help="how long each probe of the network (names, join endpoint, entrances, Dex, each peer) may "
                         "take before it fails as not answering (default 5)")


def parser(prog: str = "peering") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Peering module of the Deckhouse Platform")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version and exit")
    cp = sub.add_parser("capability-policy", help="print what a PeeringCapability may not grant, and why",
                        description="Print the capability policy (docs/capability-policy.md): the classes of "
                                    "resources and their verdicts, the resources refused with a reason of their "
                                    "own, and the nonResourceURLs a PeeringCapability may grant.")
    cp.add_argument("--resources", action="store_true",
                    help="print instead the verdict on reading and on writing every resource kube-apiserver and "
                         "Deckhouse serve, with its class and where the policy knows it from")
    _add_check(sub)
    kc = sub.add_parser("kubeconfig", help="print the kubeconfig a module's controller uses to reach a peer",
                        description="Print the kubeconfig through which a module's controller (a consumer of the "
                                    "capability) reaches the peer's Kubernetes API through this cluster's egress: "
                                    "the endpoint and CA of the ClusterPeer's status.access and the file of a "
                                    "projected ServiceAccount token with the capability's audience. Needs only "
                                    "`get clusterpeers`.")
    kc.add_argument("--peer", required=True, help="the ClusterPeer's name")
    kc.add_argument("--capability", required=True, help="the PeeringCapability's name")
    kc.add_argument("--token-file", help="where the controller's Pod has the projected token (default: where "
                                         "--manifest mounts it)")
    kc.add_argument("--manifest", action="store_true",
                    help="print the ConfigMap with the kubeconfig and the Pod fragment that projects the token")
    kc.add_argument("--kubeconfig", default=_env("kubeconfig"), help="your kubeconfig (default: $KUBECONFIG)")
    run = sub.add_parser("run", help="serve the peering gateway and run its control loop")
    listen = ListenSettings()
    run.add_argument("--kubeconfig", default=_env("kubeconfig"),
                     help="kubeconfig file; default: in-cluster ServiceAccount")
    run.add_argument("--namespace", default=_env("namespace", KubeSettings.namespace), help="module namespace")
    run.add_argument("--public-domain-template", default=_env("public-domain-template"),
                     help="global.modules.publicDomainTemplate, e.g. %%s.example.com (required)")
    run.add_argument("--bind-host", default=_env("bind-host", listen.bind_host))
    for name, default in (("entrance", listen.entrance_port), ("join", listen.join_port),
                          ("egress", listen.egress_port), ("ops", listen.ops_port)):
        run.add_argument(f"--{name}-port", type=_port, default=_port(_env(f"{name}-port", str(default))),
                         help=f"{name} listener port (0: chosen by the OS)")
    run.add_argument("--ports-file", default=_env("ports-file"), help="write the bound ports here as JSON")
    run.add_argument("--resolve", action="append", default=[], metavar="HOST=IP:PORT",
                     help="send connections to HOST to IP:PORT (repeatable)")
    run.add_argument("--dex-url", default=_env("dex-url"), help="this cluster's Dex issuer URL")
    run.add_argument("--dex-ca-file", default=_env("dex-ca-file"), help="CA bundle of Dex's serving cert")
    run.add_argument("--dex-client-name", default=_env("dex-client-name", DexSettings.client_name),
                     help="the module's DexClient in the module namespace: client ID dex-client-NAME@NAMESPACE, "
                          "secret in Secret dex-client-NAME, key clientSecret")
    run.add_argument("--workers", type=_positive, default=_positive(_env("workers", "1")),
                     help="gateway worker processes")
    run.add_argument("--exchanges-per-peer", type=_rate,
                     default=_env("exchanges-per-peer", str(Settings.exchanges_per_peer)),
                     help="Dex token exchanges one peer's consumers may cause per second (0: no bound)")
    run.add_argument("--exchange-burst-per-peer", type=_burst,
                     default=_env("exchange-burst-per-peer", str(Settings.exchange_burst_per_peer)),
                     help="Dex token exchanges one peer may cause at once before --exchanges-per-peer applies")
    run.add_argument("--trusted-proxy", dest="trusted_proxies", action="append", type=_network, metavar="CIDR",
                     help="address or CIDR of the Ingress controller in front of the join listener, whose "
                          "X-Forwarded-For names the client of a join (repeatable; PEERING_TRUSTED_PROXIES: "
                          "comma-separated)")
    # String defaults (from the environment) go through `type` like flags do, so a bad PEERING_* value gets the
    # same clear usage error as a bad flag.
    run.add_argument("--peer-sync-interval", type=_seconds,
                     default=_env("peer-sync-interval", str(ControlSettings.peer_sync_interval)),
                     help="seconds between pulls of each peer's offer")
    run.add_argument("--selfcheck-interval", type=_seconds,
                     default=_env("selfcheck-interval", str(ControlSettings.selfcheck_interval)),
                     help="seconds between probes of our own entrance")
    run.add_argument("--issuer-refresh-interval", type=_seconds,
                     default=_env("issuer-refresh-interval", str(ControlSettings.issuer_refresh_interval)),
                     help="seconds for which our ServiceAccount issuer and JWKS, published in our offer, are reused")
    run.add_argument("--optional-api-interval", type=_seconds,
                     default=_env("optional-api-interval", str(ControlSettings.optional_api_interval)),
                     help="seconds between checks whether the Project and TokenExchangeProvider APIs are served")
    run.add_argument("--server-cert-lifetime", type=_seconds,
                     default=_env("server-cert-lifetime", str(ControlSettings.server_cert_lifetime)),
                     help="seconds the entrance and egress certificates are valid (renewed at half)")
    run.add_argument("--client-cert-lifetime", type=_seconds,
                     default=_env("client-cert-lifetime", str(ControlSettings.client_cert_lifetime)),
                     help="seconds the client certificates issued to peers are valid (the peer renews at half)")
    run.add_argument("--feed-coalesce", type=_seconds,
                     default=_env("feed-coalesce", str(ControlSettings.feed_coalesce)),
                     help="seconds the registry feed gathers changes before it publishes one snapshot to the gateway "
                          "(more: fewer snapshots under churn, a registry further behind the API)")
    run.add_argument("--identity", default=_env("identity"), help="Lease holder identity (default hostname-pid)")
    run.add_argument("--log-level", default=_env("log-level", "INFO"), type=_log_level,
                     help="DEBUG, INFO, WARNING or ERROR")
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    """Build the one settings object; ValueError says which flag is wrong and what to give instead."""
    from gateway.resolve import parse_resolve_args

    if not args.public_domain_template:
        raise ValueError("--public-domain-template is required (global.modules.publicDomainTemplate, "
                         "for example %s.example.com)")
    resolve = parse_resolve_args(list(args.resolve) + [v for v in (_env("resolve") or "").split(",") if v])
    if args.dex_ca_file and not os.path.isfile(args.dex_ca_file):
        raise ValueError(f"--dex-ca-file {args.dex_ca_file}: no such file")
    if not DNS_LABEL.fullmatch(args.dex_client_name or ""):
        raise ValueError(f"--dex-client-name {args.dex_client_name!r} is not a DexClient name: give a DNS label "
                         "(lower-case letters, digits and '-', at most 63), such as peering")
    lease = LeaseSettings(identity=args.identity) if args.identity else LeaseSettings()
    return Settings(
        public_domain_template=args.public_domain_template,
        kube=KubeSettings(kubeconfig=args.kubeconfig, namespace=args.namespace),
        listen=ListenSettings(bind_host=args.bind_host, entrance_port=args.entrance_port, join_port=args.join_port,
                              egress_port=args.egress_port, ops_port=args.ops_port, ports_file=args.ports_file),
        dex=DexSettings(url=args.dex_url, ca_file=args.dex_ca_file, client_name=args.dex_client_name),
        control=ControlSettings(peer_sync_interval=args.peer_sync_interval,
                                selfcheck_interval=args.selfcheck_interval,
                                issuer_refresh_interval=args.issuer_refresh_interval,
                                optional_api_interval=args.optional_api_interval,
                                server_cert_lifetime=args.server_cert_lifetime,
                                client_cert_lifetime=args.client_cert_lifetime,
                                feed_coalesce=args.feed_coalesce),
        lease=lease, resolve=resolve, workers=args.workers, log_level=args.log_level,
        exchanges_per_peer=args.exchanges_per_peer, exchange_burst_per_peer=args.exchange_burst_per_peer,
        trusted_proxies=tuple(args.trusted_proxies if args.trusted_proxies is not None else _env_networks()))


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (SIGTERM/SIGINT set it in `main`)."""
    from control.process import run_process

    await run_process(settings, stop or asyncio.Event())


def consumer_kubeconfig(args: argparse.Namespace) -> int:
    """`peering kubeconfig`: print the consumer's kubeconfig (or, with --manifest, what mounts it); exit 1 with
    the reason when the peering or the capability cannot give one."""
    from control import consumer_config as cc

    try:
        cc.check_names(args.peer, args.capability)
        clusterpeer = asyncio.run(cc.fetch(args.kubeconfig, args.peer))
        access = cc.access_of(clusterpeer, args.capability)
    except cc.ConsumerConfigError as exc:
        print(f"peering kubeconfig: {exc.message}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:  # no kubeconfig, an unreachable API server
        print(f"peering kubeconfig: cannot read the ClusterPeer: {exc}", file=sys.stderr)
        return 1
    if args.manifest:
        print(cc.render(cc.manifest(access)), end="")
    else:
        print(cc.render([cc.kubeconfig(access, args.token_file or cc.token_path(access))]), end="")
    return 0


def peering_check(args: argparse.Namespace) -> int:
    """`peering check`: print the report; exit 0 healthy, 1 not, 2 for a bad flag."""
    from control.check.consumer import parse
    from control.check.run import Options, check
    from gateway.resolve import parse_resolve_args

    try:
        consumer = None
        if args.consumer or args.capability or args.verb or args.resource or args.name:
            if not args.consumer:
                raise ValueError("--capability, --verb, --resource and --name go with --consumer NS/SA")
            if not args.peer:
                raise ValueError("--consumer needs --peer: the ClusterPeer whose peer the module reaches")
            consumer = parse(args.consumer, args.capability, args.verb, args.resource, args.namespace, args.name)
        elif args.namespace:
            raise ValueError("--namespace goes with --consumer NS/SA")
        options = Options(kubeconfig=args.kubeconfig, peer=args.peer, consumer=consumer,
                          public_domain_template=args.public_domain_template, dex_url=args.dex_url,
                          resolve=parse_resolve_args(args.resolve), timeout=args.timeout)
    except ValueError as exc:
        print(f"peering check: {exc}", file=sys.stderr)
        return 2
    report = asyncio.run(check(options))
    sys.stdout.write(report.json() if args.output == "json" else report.text())
    return report.exit_code


def main(argv: Sequence[str] | None = None, prog: str = "peering") -> int:
    args = parser(prog).parse_args(argv)
    if args.command == "check":
        return peering_check(args)
    if args.command == "kubeconfig":
        return consumer_kubeconfig(args)
    if args.command == "version":
        print(version())
        return 0
    if args.command == "capability-policy":
        from control.rules import capability_classes, capability_policy

        if args.resources:
            sys.stdout.write(capability_policy.resources_table())
            return 0
        sys.stdout.write(capability_classes.classes_table() + "\n" + capability_policy.markdown_table() + "\n"
                         + capability_policy.shared_urls_table())
        return 0
    try:
        settings = settings_from(args)
    except ValueError as exc:
        print(f"peering run: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; this keeps a broken install explainable
        uvloop = None
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None)
    with runner:
        loop = runner.get_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            runner.run(serve(settings, stop))
        except ValueError as exc:
            log.error("cannot start", extra={"error": str(exc)})
            return 2
    return 0



def kubectl_main() -> int:
    """The `kubectl-peering` console script: kubectl (and `d8 k`) finds it on PATH and runs it for
    `kubectl peering ...` with the arguments after the plugin's name."""
    return main(prog="kubectl peering")


if __name__ == "__main__":
    sys.exit(main())
