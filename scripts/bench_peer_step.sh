#!/usr/bin/env bash
# optcc's training step beside nanoGPT's on the same shapes, one thread, at fp32 and bf16 (docs/speed.md):
#   scripts/bench_peer_step.sh NANOGPT_DIR [CONFIG ...]
# NANOGPT_DIR holds model.py from a karpathy/nanoGPT checkout you fetched yourself (nothing of it is
# committed here). CONFIG defaults to experiments/bench-mini.yaml and experiments/bench-small.yaml.
# Needs Debian's python3-torch (apt-get install python3-torch; not in scripts/deps.sh: only this
# comparison uses it) and a built optcc (OPTCC, default build/optcc). nanoGPT's step is measured
# inline below (median of 10 steps after 3 warm-ups on random tokens; bf16 = its forward under
# torch.autocast('cpu', dtype=torch.bfloat16), as nanoGPT's train.py does), optcc's with
# `optcc bench step --precision`. Each of the four runs per shape happens twice, in opposite orders;
# prints optcc's bench lines, tokens/s of the four, bf16 / fp32, optcc / nanoGPT at equal precision
# and the run-to-run spread. Run it on a quiet machine: the programs run one after the other.
set -euo pipefail
if [[ $# -lt 1 || ! -f ${1}/model.py ]]; then
  if [[ $# -lt 1 ]]; then why="no NANOGPT_DIR given"
  elif [[ ! -d $1 ]]; then why="$1: no such folder"
  else why="$1 has no model.py"; fi
  cat >&2 <<EOF
$0: $why.
The peer (nanoGPT's model.py) is not part of this repository: nothing of nanoGPT is committed here.
Fetch a karpathy/nanoGPT checkout yourself and pass its folder as the first argument:
  git clone https://github.com/karpathy/nanoGPT /tmp/nanoGPT
  $0 /tmp/nanoGPT [CONFIG ...]
(scripts/bench_speed.sh takes the same folder as its first argument and passes it on.)
EOF
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
[[ -x $OPTCC ]] || { echo "$0: no optcc at $OPTCC. Fix: make build (or set OPTCC)" >&2; exit 2; }
for c in "${configs[@]}"; do
  [[ -f $c ]] || { echo "$0: no config $c (paths are relative to $root)" >&2; exit 2; }
done
"$PYTHON" -c "import torch" 2>/dev/null || { echo "$0: $PYTHON has no torch. Fix: apt-get install python3-torch" >&2; exit 2; }
echo "peer: nanoGPT model from $nanogpt/model.py, measured inline (fp32 and autocast bf16)"

# L H HEADS SEQ VOCAB BATCH of a config, from `optcc config show` (the resolved config).
shape_of() {
  "$OPTCC" config show --config "$1" | "$PYTHON" -c '
import sys, yaml
c = yaml.safe_load(sys.stdin)
m, t = c["model"], c["train"]
v = m["vocab_size"] or c["data"]["vocab_size"]
print(m["num_layers"], m["hidden_size"], m["num_heads"], m["seq_len"], v, t["global_batch_size"])'
}

peer_step() {  # PRECISION L H HEADS SEQ VOCAB BATCH -> tokens/s
  # nanoGPT's step as its users run it: fp32, or under torch.autocast('cpu', dtype=torch.bfloat16)
  # (weights fp32, matmuls bf16): median of 10 steps (forward, backward, AdamW) after 3 warm-ups.
  (OPENBLAS_NUM_THREADS=1 "$PYTHON" - "$nanogpt" "$@" <<'PY'
import contextlib, sys, time, statistics, torch
sys.path.insert(0, sys.argv[1])
from model import GPT, GPTConfig
precision = sys.argv[2]
L, H, NH, S, V, B = map(int, sys.argv[3:9])
torch.set_num_threads(1); torch.manual_seed(0)
m = GPT(GPTConfig(block_size=S, vocab_size=V, n_layer=L, n_head=NH, n_embd=H, dropout=0.0, bias=True))
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01)
x = torch.randint(0, V, (B, S)); y = torch.randint(0, V, (B, S))
ctx = (lambda: torch.autocast('cpu', dtype=torch.bfloat16)) if precision == 'bf16' else contextlib.nullcontext
ts = []
for i in range(13):
    t = time.perf_counter()
    with ctx():
        _, loss = m(x, y)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    if i >= 3: ts.append(time.perf_counter() - t)
print(f"{B * S / statistics.median(ts):.0f}")
PY
  ) | sed -n 's/^[[:space:]]*\([0-9][0-9]*\(\.[0-9]*\)\{0,1\}\)[[:space:]]*$/\1/p' | tail -n 1
  # only a line that is the figure alone: model.py prints other lines ("number of parameters: ...",
  # "WARNING: using slow attention ..." before PyTorch 2.0), which are not the output looked for
}

number() {  # WHAT VALUE: VALUE when it is one number, else exit naming WHAT
  [[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] && return 0
  echo "$0: $1 gave no tokens/s figure (got '${2//$'\n'/ }'); run it by hand to see its output" >&2
  exit 1
}

optcc_step() {  # CONFIG PRECISION -> the bench step output
  "$OPTCC" bench step --config "$1" --threads 1 --precision "$2"
}

echo "machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), bf16 instructions: $(grep -o -w -e avx512_bf16 -e amx_bf16 /proc/cpuinfo | sort -u | tr '\n' ' ')"
for config in "${configs[@]}"; do
  read -r L H NH S V B < <(shape_of "$config")
  # Two rounds in opposite orders; each figure is the mean of its two runs, the spread their ratio.
  declare -A got=()
  for round in 1 2; do
    order=(optcc:fp32 optcc:bf16 nanogpt:fp32 nanogpt:bf16)
    [[ $round == 2 ]] && order=(nanogpt:bf16 nanogpt:fp32 optcc:bf16 optcc:fp32)
    for run in "${order[@]}"; do
      who=${run%%:*} precision=${run##*:}
      if [[ $who == optcc ]]; then
        out=$(optcc_step "$config" "$precision")
        [[ $round == 1 ]] && echo "$out" | sed -n '1,2p'
        value=$(sed -n 's/.* | \([0-9.]*\) tokens\/s .*/\1/p' <<<"$out" | tail -n 1)
        number "$OPTCC bench step --config $config --precision $precision" "$value"
      else
        value=$(peer_step "$precision" "$L" "$H" "$NH" "$S" "$V" "$B") || true  # number() says why
        number "nanoGPT's step ($nanogpt/model.py, $precision)" "$value"
      fi
      got[$run]="${got[$run]:-} $value"
    done
  done
  "$PYTHON" - "$config (L$L h$H s$S V$V B$B)" "${got[optcc:fp32]}" "${got[optcc:bf16]}" "${got[nanogpt:fp32]}" "${got[nanogpt:bf16]}" <<'PY'
import sys
name = sys.argv[1]


def numbers(text):  # the words that are numbers: anything else (a stray warning line) is left out
    out = []
    for word in text.split():
        try:
            out.append(float(word))
        except ValueError:
            pass
    return out


runs = [numbers(a) for a in sys.argv[2:6]]
if not all(runs):
    sys.exit(f"{name}: a program gave no tokens/s figure in either round")
mean = [sum(r) / len(r) for r in runs]
spread = max(max(r) / min(r) for r in runs)
of, ob, nf, nb = mean
print(f"{name}: tokens/s optcc fp32 {of:.0f}, optcc bf16 {ob:.0f}, nanoGPT fp32 {nf:.0f}, nanoGPT bf16 (autocast) {nb:.0f}")
print(f"  optcc bf16 / optcc fp32 {ob / of:.2f} | optcc / nanoGPT: fp32 {of / nf:.2f}, bf16 {ob / nb:.2f} | "
      f"run-to-run spread up to {100 * (spread - 1):.0f}%")
PY
done
