#!/bin/sh
# The mesh's identities for Slurm and bare metal (Kubernetes: deploy/components/mesh-tls): a cluster
# CA, one certificate per node naming the node, and the controller's, made with openssl.
#
#   deploy/tls/make-certs.sh OUT NODES_FILE [CONTROLLER_NAME]
#
# NODES_FILE: one node name a line, as the daemon knows itself (`--node`, the hostname):
#   sinfo -N -h -o %N | sort -u > nodes.txt
# OUT gets ca.crt and ca.key (keep the key off the nodes), and a folder per name holding ca.crt,
# tls.crt and tls.key: copy a node's folder to /etc/nodehealth/tls/ on that node (the key mode 0600,
# owned by the daemon's user). A CA already in OUT is reused, so the script also adds nodes and renews.
# Certificates carry the name as a DNS subjectAltName (what the peers check) and serve as both
# server and client (the mesh is mutual). DAYS (default 365) sets their lifetime, CA_DAYS (3650) the CA's.
set -eu

usage() { echo "usage: $0 OUT NODES_FILE [CONTROLLER_NAME]" >&2; exit 2; }
[ $# -ge 2 ] || usage
out=$1
nodes=$2
controller=${3:-nodehealth-controller}
days=${DAYS:-365}
ca_days=${CA_DAYS:-3650}
[ -r "$nodes" ] || { echo "$0: cannot read $nodes" >&2; exit 2; }

umask 077
mkdir -p "$out"
if [ ! -f "$out/ca.key" ]; then
    openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$out/ca.key" -out "$out/ca.crt" -days "$ca_days" -subj "/CN=nodehealth mesh CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

issue() {  # NAME: OUT/NAME/{ca.crt,tls.crt,tls.key}
    case $1 in
        *[!A-Za-z0-9.-]*|'') echo "$0: not a DNS name: '$1'" >&2; exit 2 ;;
    esac
    dir="$out/$1"
    mkdir -p "$dir"
    ext=$(mktemp)
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n%s\nsubjectAltName=DNS:%s\n' \
        'extendedKeyUsage=serverAuth,clientAuth' "$1" > "$ext"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$dir/tls.key" \
        -subj "/CN=$1" 2>/dev/null |
        openssl x509 -req -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial -days "$days" \
            -extfile "$ext" -out "$dir/tls.crt" 2>/dev/null
    rm -f "$ext"
    cp "$out/ca.crt" "$dir/ca.crt"
}

count=0
while IFS= read -r name || [ -n "$name" ]; do
    name=$(printf '%s' "$name" | tr -d '[:space:]')
    [ -n "$name" ] || continue
    issue "$name"
    count=$((count + 1))
done < "$nodes"
issue "$controller"
echo "$out: CA, $count node certificates and the controller's ($controller), valid $days days"
