"""The lab's kube-apiserver: `app.ApiServer` serves the Kubernetes REST API over TLS on loopback, with the
built-in kinds the module uses and any CRDs given; `testing` starts one for tests. See README.md here."""
