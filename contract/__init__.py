"""The contract the gateway and the control loop share: one place for every name, path, reason and the one error
type, so that a rule changed on one side is changed on the other.

- `names`: namespace, labels, bounded names, the audience of a consumer token, the TokenExchangeProvider (and
  Dex connector) of a peering, the peer Secret, the exchanged username's prefix, the module's Dex client.
- `paths`: the peer protocol's operations, the join path, the egress prefix.
- `peer_secret`: the peer Secret's keys and `PeerCredentials`, its typed value (the control loop writes it, the
  gateway's registry reads it).
- `reasons`: every machine-readable reason the module answers a request with, with its HTTP code.
- `errors`: `Refusal`, the one error that carries code, reason and message, and `InputError` for input the
  module cannot use (a connection string, a join message, a certificate, spec.invite).
- `served`: what the clusters serve, as data: every resource of kube-apiserver (`served_kubernetes`) and every
  CRD of Deckhouse's modules (`served_deckhouse`), with its scope and where it comes from; the capability
  policy judges each of them by its class.

It imports nothing of the gateway or the control loop; both import it.
"""
