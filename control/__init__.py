"""The control loop of the peering module, in the same process as the gateway.

Runtime (how it runs): `cli` (the `peering` command) builds `config.Settings` and starts `process.Runtime`, the
composition root: `kube` (one API session), `watch`/`informers` (shared informers), `feed` (registry snapshots and
certificates for the gateway), `lease` (leader election), `workqueue` (reconcilers on the Lease holder),
`bootstrap` (the cluster's own CA and server certificates). Every reconciler and handler gets a `context.Context`.
Rules (what it decides) are pure functions in `rules/`, `pki` and `connstring`; the reconcilers in `reconcilers/`
and the request handlers in `handlers/` join the two. The map, file by file: README.md.
"""
