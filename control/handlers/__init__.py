"""Request handlers of the peering protocol: `POST /v1/join` on the inviting side (`join`), and the mTLS peer
operations `offer`, `notify`, `credentials` and `certificate` (`peer`). They run on every replica, read the shared
caches, and write only with resourceVersion preconditions."""
