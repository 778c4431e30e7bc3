#!/usr/bin/env bash
# Start-up time of `nanoserve serve` on a checkpoint folder: seconds from the command to the
# first 200 from /health, with the files in the page cache (warm, twice) and evicted from it
# (cold), then transformers' from_pretrained(device_map="cuda") on the same folder. Given a
# config file instead of a folder, the start-up with random weights of that shape (twice).
#
#   tools/startup.sh NANOSERVE MODEL_DIR|CONFIG.json [extra nanoserve arguments]
set -uo pipefail
bin=$1; dir=$2; shift 2
port=8011
ready() {
    local t0 t1 pid
    t0=$(date +%s.%N)
    "$bin" serve --device cuda "${source[@]}" --port $port "$@" 2> >(sed 's/^/  serve: /' >&2) &
    pid=$!
    until curl -sf "127.0.0.1:$port/health" >/dev/null; do
        kill -0 $pid 2>/dev/null || { echo "serve exited before it was ready"; return 1; }
        sleep 0.02
    done
    t1=$(date +%s.%N)
    kill -INT $pid; wait $pid
    echo "ready in $(python3 -c "print(f'{$t1 - $t0:.2f}')") s"
}
evict() {
    python3 - "$dir" <<'PY'
import os, sys
for name in sorted(os.listdir(sys.argv[1])):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}
if [[ $dir == *.json ]]; then
    source=(--random-weights --config "$dir")
    echo "random weights:"; ready "$@"
    echo "random weights:"; ready "$@"
    exit
fi
source=(--model "$dir")
cat "$dir"/*.safetensors > /dev/null
echo "warm:"; ready "$@"
echo "warm:"; ready "$@"
evict
echo "cold (page cache evicted):"; ready "$@"
cat "$dir"/*.safetensors > /dev/null
python3 - "$dir" <<'PY'
import sys, time
t0 = time.time()
import torch
from transformers import AutoModelForCausalLM
t1 = time.time()
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16, device_map="cuda")
torch.cuda.synchronize()
t2 = time.time()
print(f"transformers from_pretrained (warm): {t2 - t1:.2f} s (import {t1 - t0:.2f} s)")
PY
