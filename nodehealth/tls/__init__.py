"""The mesh's identity: mutual TLS from a cluster CA, and who may read the daemon's HTTP."""
