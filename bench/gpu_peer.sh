#!/usr/bin/env bash
# Issue 37's side-by-side run (bench/peer_gpu.py) on a lent GPU machine, in
# the form bench/gpu_remote.sh calls a script:
#
#     bench/gpu_remote.sh .devrun/pack.tar.xz SECONDS bench/gpu_peer.sh PEER_XZ [peer_gpu.py options]
#
# which runs `bench/gpu_peer.sh /tmp/p/b /tmp/gpu-out SECONDS PEER_XZ ...`.
# PEER_XZ is llama.cpp's llama-batched-bench built here with CUDA
# (tools/scripts/llama_cpp_peer.sh --cuda sm_90), stripped and compressed
# (`strip` then `xz -6`: about 41 MB, which fits a call's 64 MiB beside the
# 12 MB pack; both llama.cpp binaries do not). The tables come back in
# /tmp/gpu-out: summary.txt (the table), peer/ (raw.txt, peer_gpu.json).
set -u
B=$1
O=$2
SECONDS_LEFT=$3
PXZ=${4:?gpu_peer.sh: the compressed llama-batched-bench (PEER_XZ) is missing}
shift 4
mkdir -p "$O" /tmp/peer
if ! xz -dc "$PXZ" > /tmp/peer/llama-batched-bench; then
    echo "gpu_peer: cannot unpack $PXZ" | tee "$O/summary.txt" >&2
    exit 1
fi
chmod +x /tmp/peer/llama-batched-bench
if ! /tmp/peer/llama-batched-bench --help > "$O/peer_help.txt" 2>&1; then
    echo "gpu_peer: llama-batched-bench does not start here (missing libraries?):" | tee "$O/summary.txt" >&2
    tail -5 "$O/peer_help.txt" | tee -a "$O/summary.txt" >&2
    exit 1
fi
# keep 20 s for the tables and the copy back
timeout $((SECONDS_LEFT > 40 ? SECONDS_LEFT - 20 : 20)) \
    python3 bench/peer_gpu.py --hetkv "$B/tools/hetkv" --peer /tmp/peer --out "$O/peer" "$@" \
    2> "$O/all.log"
rc=$?
if [ -f "$O/peer/table.md" ]; then
    cp "$O/peer/table.md" "$O/summary.txt"
else
    { echo "gpu_peer: no table (exit $rc)"; tail -20 "$O/all.log"; } > "$O/summary.txt"
fi
exit $rc
