#!/usr/bin/env bash
# optcc's training step beside nanoGPT's on the same shapes, one thread, one run each (issue 14):
#   scripts/bench_peer_step.sh NANOGPT_DIR [CONFIG ...]
# NANOGPT_DIR holds model.py from a karpathy/nanoGPT checkout you fetched yourself (nothing of it is
# committed here). CONFIG defaults to experiments/bench-mini.yaml and experiments/bench-small.yaml.
# Needs Debian's python3-torch (apt-get install python3-torch; not in scripts/deps.sh: only this
# comparison uses it) and a built optcc (OPTCC, default build/optcc). The peer runs
# ../shared/peers/gpt_step_nanogpt.py when it exists, else the same measurement inline: median of
# 10 steps (forward, backward, AdamW) after 3 warm-ups on random tokens. Prints one line per shape:
# optcc tokens/s, nanoGPT tokens/s and their ratio, plus optcc's GEMM library line. Run it on a
# quiet machine: the two programs run one after the other.
set -euo pipefail
if [[ $# -lt 1 || ! -f ${1}/model.py ]]; then
  echo "usage: $0 NANOGPT_DIR [CONFIG ...]  (NANOGPT_DIR/model.py: nanoGPT's model file)" >&2
  exit 2
fi
nanogpt=$(cd "$1" && pwd)
shift
configs=("$@")
[[ ${#configs[@]} -gt 0 ]] || configs=(experiments/bench-mini.yaml experiments/bench-small.yaml)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"  # build/optcc and experiments/ are relative to the repository root
OPTCC=${OPTCC:-build/optcc}
PYTHON=${PYTHON:-/usr/bin/python3}
peer=$root/../shared/peers/gpt_step_nanogpt.py
[[ -x $OPTCC ]] || { echo "$0: no optcc at $OPTCC. Fix: make build (or set OPTCC)" >&2; exit 2; }
for c in "${configs[@]}"; do
  [[ -f $c ]] || { echo "$0: no config $c (paths are relative to $root)" >&2; exit 2; }
done
"$PYTHON" -c "import torch" 2>/dev/null || { echo "$0: $PYTHON has no torch. Fix: apt-get install python3-torch" >&2; exit 2; }
if [[ -f $peer ]]; then
  echo "peer: $peer (the shared peer script), nanoGPT model from $nanogpt"
else
  echo "peer: the inline nanoGPT step below (median of 10 after 3 warm-ups), model from $nanogpt"
fi

# L H HEADS SEQ VOCAB BATCH of a config, from `optcc config show` (the resolved config).
shape_of() {
  "$OPTCC" config show --config "$1" | "$PYTHON" -c '
import sys, yaml
c = yaml.safe_load(sys.stdin)
m, t = c["model"], c["train"]
v = m["vocab_size"] or c["data"]["vocab_size"]
print(m["num_layers"], m["hidden_size"], m["num_heads"], m["seq_len"], v, t["global_batch_size"])'
}

peer_step() {  # L H HEADS SEQ VOCAB BATCH -> tokens/s
  if [[ -f $peer ]]; then
    OPENBLAS_NUM_THREADS=1 "$PYTHON" "$peer" "$nanogpt" 1 "$@" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p'
  else
    OPENBLAS_NUM_THREADS=1 "$PYTHON" - "$nanogpt" "$@" <<'PY'
import sys, time, statistics, torch
sys.path.insert(0, sys.argv[1])
from model import GPT, GPTConfig
L, H, NH, S, V, B = map(int, sys.argv[2:8])
torch.set_num_threads(1); torch.manual_seed(0)
m = GPT(GPTConfig(block_size=S, vocab_size=V, n_layer=L, n_head=NH, n_embd=H, dropout=0.0, bias=True))
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01)
x = torch.randint(0, V, (B, S)); y = torch.randint(0, V, (B, S))
ts = []
for i in range(13):
    t = time.perf_counter()
    _, loss = m(x, y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    if i >= 3: ts.append(time.perf_counter() - t)
print(f"{B * S / statistics.median(ts):.0f}")
PY
  fi
}

for config in "${configs[@]}"; do
  read -r L H NH S V B < <(shape_of "$config")
  out=$("$OPTCC" bench step --config "$config" --threads 1)
  ours=$(sed -n 's/.* | \([0-9.]*\) tokens\/s .*/\1/p' <<<"$out")
  theirs=$(peer_step "$L" "$H" "$NH" "$S" "$V" "$B")
  echo "$out" | sed -n '1,2p'
  "$PYTHON" -c "print(f'$config (L$L h$H s$S V$V B$B): optcc $ours tokens/s, nanoGPT $theirs tokens/s, ratio {$ours / $theirs:.2f}')"
done
