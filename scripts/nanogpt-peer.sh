#!/usr/bin/env bash
# bytemtp against nanoGPT on Tiny Shakespeare, side by side in one sitting (BENCHMARKS.md):
#   scripts/nanogpt-peer.sh NANOGPT_CHECKOUT [OUT] [ROUNDS]
# Each round runs, one after another on the same machine:
#   nanogpt  nanoGPT's CPU recipe as its README gives it (its char-level data prepared from our copy
#            of the text, so nothing is downloaded);
#   same     bytemtp's next-byte model at that shape and step count (examples/nanogpt-shakespeare.toml);
#   best     bytemtp's best recipe (examples/shakespeare-best.toml, or BEST=file.toml) for the wall
#            time nanoGPT took in that round (--time: the schedule is fitted to it).
# Every model is then scored on the whole of nanoGPT's val text (the last 10% of the file) in
# windows of its own context, nats per byte (the text is ASCII: a character is a byte); the ms a
# step is the median step time (nanoGPT's log, bytemtp's metrics), and wall_s the whole training
# process. OUT/results.tsv gets one line per run.
set -euo pipefail
NANOGPT=${1:?usage: scripts/nanogpt-peer.sh NANOGPT_CHECKOUT [OUT] [ROUNDS]}
OUT=${2:-runs/nanogpt-peer}
ROUNDS=${3:-1}
BEST=${BEST:-examples/shakespeare-best.toml}
TEXT=${SHAKESPEARE:-../shared/data/tinyshakespeare.txt}
PY=${PYTHON:-python3}
NANOGPT=$(cd "$NANOGPT" && pwd)
[ -f "$NANOGPT/train.py" ] || { echo "$NANOGPT is not a nanoGPT checkout (no train.py)" >&2; exit 1; }
[ -f "$TEXT" ] || { echo "no Tiny Shakespeare at $TEXT (set SHAKESPEARE=path/to/input.txt)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
make -s corpus-shakespeare SHAKESPEARE="$TEXT" >/dev/null
data="$NANOGPT/data/shakespeare_char"
if [ ! -f "$data/val.bin" ]; then
  cp "$TEXT" "$data/input.txt"
  (cd "$data" && $PY prepare.py >/dev/null)
fi

nanogpt_val() {  # nats per character of a nanoGPT checkpoint on the whole of val.bin, windows of 64
  $PY - "$NANOGPT" "$1" <<'PYEOF'
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
from model import GPT, GPTConfig
ckpt = torch.load(f"{sys.argv[2]}/ckpt.pt", map_location="cpu")
model = GPT(GPTConfig(**ckpt["model_args"]))
model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
model.eval()
val = torch.from_numpy(np.fromfile(f"{sys.argv[1]}/data/shakespeare_char/val.bin", dtype=np.uint16).astype(np.int64))
T = ckpt["model_args"]["block_size"]
nats = count = 0.0
with torch.no_grad():
    for start in range(0, len(val) - 1, T * 64):
        chunk = val[start:start + T * 64 + 1]
        n = (len(chunk) - 1) // T
        if n == 0:
            break
        x, y = chunk[:n * T].view(n, T), chunk[1:n * T + 1].view(n, T)
        logits, _ = model(x, y)
        nats += torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
        count += y.numel()
print(f"{nats / count:.4f}")
PYEOF
}

bytemtp_val() {  # nats per byte of head 1 on the whole val split
  $PY -m bytemtp_cli eval --ckpt "$1" --split val --batches 100000 --batch-size 2 --device cpu --json "$1/val.json" >/dev/null
  $PY -c "import json, math, sys; print(f\"{json.load(open(sys.argv[1]))['bpb'][0] * math.log(2):.4f}\")" "$1/val.json"
}

ms_per_step() {  # the median step of a run's logged steps (as nanoGPT's figure), and its steps
  $PY -c "
import json, statistics, sys
cfg = json.load(open(sys.argv[1] + '/run-config.json'))
step_bytes = cfg['data']['batch_size'] * cfg['model']['seq_len'] * cfg['train']['grad_accum']
lines = [json.loads(l) for l in open(sys.argv[1] + '/metrics.jsonl') if '\"loss\"' in l]
print(f\"{1000 * statistics.median(step_bytes / r['bytes_per_s'] for r in lines[1:]):.1f} {lines[-1]['step']}\")" "$1"
}

[ -f "$OUT/results.tsv" ] || printf 'round\tarm\tval_nats_per_byte\tms_per_step\tsteps\twall_s\n' > "$OUT/results.tsv"
for round in $(seq 1 "$ROUNDS"); do
  dir="$OUT/nanogpt-$round"; rm -rf "$dir"
  start=$(date +%s.%N)
  (cd "$NANOGPT" && $PY train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 \
     --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 \
     --lr_decay_iters=2000 --dropout=0.0 --always_save_checkpoint=True --out_dir="$dir") > "$OUT/nanogpt-$round.log" 2>&1
  wall=$($PY -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
  ms=$(grep -o 'time [0-9.]*ms' "$OUT/nanogpt-$round.log" | tail -n +3 | sed 's/time //; s/ms//' | sort -n | \
       awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf '%s\tnanogpt\t%s\t%s\t2000\t%s\n' "$round" "$(nanogpt_val "$dir" | tail -1)" "$ms" "$wall" | tee -a "$OUT/results.tsv"

  for arm in same best; do
    dir="$OUT/$arm-$round"; rm -rf "$dir"
    if [ "$arm" = same ]; then
      args=(--config examples/nanogpt-shakespeare.toml)
    else
      args=(--config "$BEST" --time "${wall}s" --set train.steps=0)
    fi
    start=$(date +%s.%N)
    $PY -m bytemtp_cli train --preset small "${args[@]}" --out "$dir" > "$OUT/$arm-$round.log" 2>&1
    arm_wall=$($PY -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
    read -r ms steps < <(ms_per_step "$dir")
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$arm" "$(bytemtp_val "$dir")" "$ms" "$steps" "$arm_wall" | tee -a "$OUT/results.tsv"
  done
done
