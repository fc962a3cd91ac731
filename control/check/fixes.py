"""What to do about each reason `peering check` can show: the Ready reasons of a ClusterPeer (docs/protocol.md
§5), TokenExchangeReady's, and the refusals a consumer's request can meet at the gateways or the peer's API
server (gateway/README.md). One sentence each, in an administrator's words."""

from __future__ import annotations

from contract import reasons

READY = {
    "AwaitingOffer": "wait a pull interval (`--peer-sync-interval`, 30 s by default); if it stays, check the other cluster's module (`d8 k "
        "peering check` there)",
    "PeerUnreachable": "check that peering-gateway.<domain> of the other cluster resolves and is reachable "
        "from this cluster without TLS termination, and that the module runs there; the peering"
        " stays meanwhile",
    reasons.PEER_REFUSED_CERTIFICATE: "the other cluster refuses our certificate: it has probably deleted its "
        "ClusterPeer (revoked the peering). Ask its administrator; if so, delete this "
        "ClusterPeer too, or establish the peering anew on both clusters",
    reasons.OFFER_INVALID: "the other cluster's offer broke a bound; check the module's version and its "
        "PeeringCapabilities there (the previous offer is kept meanwhile)",
    reasons.OFFER_TOO_LARGE: "the other cluster offers too many projects, namespaces or capabilities; reduce "
        "them there",
    "ProviderRejected": "see the TokenExchangeReady line: user-authn must serve TokenExchangeProviders and the"
        " module must be allowed to write them",
    "ForeignProvider": "a TokenExchangeProvider of this peering's name was not written by the module: delete "
        "or rename it (`d8 k get tokenexchangeproviders`)",
    "InvitePending": "give status.invite.connectionString to the other cluster's administrator, who creates a "
        "ClusterPeer of type Join with it",
    "InviteExpired": "nothing: a new connection string is being issued; hand over the new one",
    "Joining": "wait: the join is under way",
    "CredentialsPending": "wait; if it stays, check that each cluster reaches the other's "
        "peering-gateway.<domain>",
    "JoinEndpointUnreachable": "check that peering.<domain> of the inviting cluster resolves and answers from "
        "this cluster (its Ingress and https mode)",
    "JoinRefused": "check that the connection string's join URL is the inviting cluster's peering module",
    reasons.TOO_MANY_ATTEMPTS: "wait a minute; check that the connection string is the current one",
    reasons.INVALID_CSR: "the modules' versions may disagree; update the module on both clusters",
    reasons.UNSUPPORTED_KEY: "the modules' versions may disagree; update the module on both clusters",
    reasons.MALFORMED: "copy the connection string again, whole, from the inviting cluster",
    "UnsupportedVersion": "update the module on this cluster: the string is of a newer version",
    "TooLong": "copy the connection string again, whole, from the inviting cluster",
    "Expired": "ask the inviting cluster for the current connection string (an expired one is replaced there)",
    reasons.CLUSTER_NOT_EXPECTED: "the string was issued for another cluster, or spec.join.expectedClusterUUID"
        " is wrong: check both",
    reasons.TOKEN_INVALID: "ask the inviting cluster for a new connection string and put it in spec.join",
    reasons.TOKEN_EXPIRED: "ask the inviting cluster for a new connection string and put it in spec.join",
    reasons.TOKEN_USED: "a string is valid for one connection: ask the inviting cluster for a new one",
    reasons.CLUSTER_UUID_IN_USE: "the two clusters peer already, or the UUID is this cluster's own: delete the old "
        "ClusterPeer on the cluster the message names, then this one, and join anew",
    "JoinAbandoned": "the previous string's join never completed: give the new status.invite.connectionString to "
        "the joining cluster",
    "RedeemedWithAnotherKey": "the joining ClusterPeer was made again before its first join completed: give the "
        "new status.invite.connectionString to the joining cluster",
    "PrefixConflict": "another TokenExchangeProvider's usernamePrefix overlaps this peering's: delete the stale "
        "provider (`d8 k get tokenexchangeproviders`)",
    "PinMismatch": "the join endpoint is not the inviting cluster's module (a proxy or a wrong DNS record in "
        "between?); check peering.<domain> of that cluster",
    "InvalidAnswer": "the join endpoint is not the inviting cluster's module, or its version is incompatible",
    "InvalidTokenTTL": "set spec.invite.tokenTTL to a duration from 10m to 24h",
    "InvalidSpec": "fix the spec as the message says",
    "CredentialsFromOtherCA": "the module was disabled and enabled again: delete this ClusterPeer and "
        "establish the peering anew on both clusters",
    reasons.KEY_MISMATCH: "restore the Secret d8-peering/peer-<name> with the key the peering was made with (from "
        "a backup of it), or delete the ClusterPeer on both clusters and establish the peering anew",
}

TOKEN_EXCHANGE = {
    "ProviderPending": "wait for user-authn to apply the TokenExchangeProvider; if it stays, check user-authn "
        "(`d8 k -n d8-user-authn get pods`)",
    "ProviderDeleting": "wait: the provider is created again once the old one is gone",
    "ProviderNotReady": "read the TokenExchangeProvider's status (`d8 k get tokenexchangeprovider "
        "peering-<peer> -o yaml`) and user-authn's log",
    "ProviderRejected": "enable user-authn with TokenExchangeProvider support, and check that the module may "
        "write tokenexchangeproviders",
    "ForeignProvider": "delete or rename the TokenExchangeProvider the module did not write",
    "AwaitingIssuer": "wait for the peer's next offer; if it stays, check the other cluster's module",
    "PrefixConflict": "another provider uses the same username prefix: delete the stale one",
    "InvalidSpec": "the peer's keys or issuer are not usable; check the other cluster's module",
    "DiscoveryFailed": "read user-authn's message; the peer's issuer must be reachable by user-authn or its "
        "keys given inline",
    "ApplyError": "read user-authn's message and log",
}

CONSUMER = {
    reasons.TOKEN_INVALID: "the token is not accepted by this cluster's API server: check the ServiceAccount",
    reasons.TOKEN_AUDIENCE_MISMATCH: "the token must have the audience of status.access.audiences for the "
        "capability",
    reasons.NOT_A_CONSUMER: "add the ServiceAccount to spec.consumers of the PeeringCapability (on both "
        "clusters)",
    reasons.NO_EFFECTIVE_CAPABILITY: "open the capability in spec.capabilities of the ClusterPeer on both "
        "clusters; EFFECTIVE of `d8 k get clusterpeers` must list it",
    reasons.PEER_UNKNOWN: "the other cluster does not know this peering any more (revoked): establish it anew",
    reasons.PEER_NOT_CONNECTED: "the other cluster's entrance cannot be reached: see the clusterpeer line",
    reasons.PEER_CREDENTIALS_INVALID: "the peering's credentials are unusable: see the certificates line",
    reasons.PEER_REFUSED_CERTIFICATE: "the other cluster refuses our client certificate: see the clusterpeer and "
        "certificates lines",
    reasons.TOKEN_EXPIRED: "read the projected token file again: the kubelet renews it before it expires",
    reasons.TOKEN_EXCHANGE_REFUSED: "Dex of the other cluster refused the token: its TokenExchangeReady says "
        "why",
    reasons.TOKEN_EXCHANGE_MISCONFIGURED: "the other cluster's module cannot use its Dex client: run `peering "
        "check` there",
    reasons.TOKEN_EXCHANGE_UNAVAILABLE: "Dex of the other cluster did not answer; retried on the next request",
    reasons.TOKEN_REVIEW_UNAVAILABLE: "this cluster's API server did not answer the TokenReview; retried on "
        "the next request",
    "Forbidden": "the other cluster's RBAC does not allow it: the capability's rules there, in the paired "
        "projects' namespaces only, are all it grants",
    reasons.NOT_FOUND: "the resource or namespace does not exist on the other cluster (or is not a paired "
        "project's)",
    reasons.UPSTREAM_UNAVAILABLE: "the other cluster's API server did not answer its gateway; retried",
    reasons.UPSTREAM_FAILED: "the other cluster's API server failed the request; retried",
}


EXPIRED_WHILE_AWAY = ("nothing but the peer's return: our certificate expired while the peer was unreachable and "
                      "is renewed over the peering as soon as it answers again (see the sync line); if the peer "
                      "is up, check that this cluster reaches its peering-gateway.<domain> and that both clocks "
                      "are right")
PEER_HAS_ANOTHER_CA = ("the other cluster's module was disabled and enabled again: delete this ClusterPeer and "
                       "establish the peering anew on both clusters")
PEER_CHECKS_DATES = ("update the module on the other cluster: its version refuses an expired certificate in the "
                     "handshake; the peering then resumes by itself")


def ready_fix(reason: str) -> str:
    return READY.get(reason, "read the Ready condition's message: `d8 k get clusterpeer <name> -o yaml`")


def token_exchange_fix(reason: str) -> str:
    return TOKEN_EXCHANGE.get(reason, "read the TokenExchangeReady condition's message")


def consumer_fix(reason: str) -> str:
    return CONSUMER.get(reason, "the message says why; gateway/README.md lists every refusal")
