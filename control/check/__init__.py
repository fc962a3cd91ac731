"""`peering check` (also `kubectl peering check`, `d8 k peering check`): what the guide's Preparation and each
peering depend on, checked read-only with the caller's kubeconfig, one line per check with ✓, ✗ or !, and for
each failure the reason and the fix.

| file | its one job |
|---|---|
| `cluster.py` | what is read from the API server, each read saying whether it worked, found nothing, was forbidden or is not served |
| `probes.py` | what is asked of the network from here, now, each within its timeout: names, the join endpoint, the entrance without a client certificate, Dex's discovery and token endpoint, each peer's entrance (an offer pull) |
| `judge.py` | the module's lines (module, replicas, leader, https, names, entrance, self-check, certificates), pure |
| `dex.py` | user-authn's and Dex's lines (the module, discovery, the `kubernetes` client, the module's client), pure |
| `peers.py` | one peering's lines (phase and Ready, sync, the peer's entrance now against the status, certificates, TokenExchangeReady, capabilities, projects), pure |
| `consumer.py` | `--consumer`: a module's access proved end to end through both gateways |
| `fixes.py` | what to do about each reason |
| `report.py` | the lines and their text and JSON |
| `run.py` | the order of it all, and where the domain and Dex's URL come from |
"""
