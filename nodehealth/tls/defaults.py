"""The `tls` section: the mesh's identity (mutual TLS from a cluster CA). Off until enabled; turning it
on is this one key once every node has its certificate (deploy/components/mesh-tls, or
deploy/tls/make-certs.sh for Slurm and bare metal). The file names are cert-manager's Secret keys."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "ca_file": "/etc/nodehealth/tls/ca.crt",
    "cert_file": "/etc/nodehealth/tls/tls.crt",
    "key_file": "/etc/nodehealth/tls/tls.key",
    "controller_name": "nodehealth-controller",
}

MEANINGS = {
    "enabled": ("mutual TLS between agents, the controller and netcheck: the pingmesh Ping, the daemon's and the "
                "controller's HTTP, netcheck's agents. Every node then needs a certificate from the cluster CA "
                "that names it (DNS subjectAltName = the node's name); see docs/threat-model.md"),
    "ca_file": "the cluster CA's certificate(s), PEM: a peer's certificate must chain to it",
    "cert_file": "this process's certificate, PEM (a node's names the node, the controller's `controller_name`)",
    "key_file": ("its private key, PEM. The three files are read again when one changes (cert-manager's "
                 "rotation): new connections use the new ones"),
    "controller_name": ("the name the pingmesh controller's certificate carries: only it may read an agent's "
                        "`/v1/pingmesh`"),
}
