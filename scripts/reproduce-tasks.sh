#!/usr/bin/env bash
# The paper's small-scale experiments (section 4) on one synthetic task: the same model trained
# with n_future 1, 2, 4 and 8 on the same batches for the same number of steps, then the task's
# accuracy for each. Usage: scripts/reproduce-tasks.sh poly|induction|humaneval
# humaneval: the same, on the default code corpus (data/corpus/stdlib), n_future 1 and 8 by default
# (HEADS), then greedy pass@1 on HumanEval's 164 problems (completions of MAX_BYTES, 256) and the
# bytes per forward pass that the heads buy. At CPU scale pass@1 stays near 0 for both: the line is
# for a GPU budget (raise STEPS, WIDTH, LAYERS; SEQ 512 by default).
# Settings (environment): STEPS (800), WIDTH (d_model, 128), LAYERS (n_layers, 10: every model has
# as many layers, the heads take theirs from the trunk), SEQ (context: 256 for poly, 512 for
# induction), BATCH (4096 bytes a step: 16 for poly, 8 for induction), HEADS ("1 2 4 8"), OUT (runs/repro-TASK). Results: $OUT/summary.json
# and a table on screen. With the defaults a model takes 7 (poly) to 9 (induction) minutes on two
# CPU cores, or 13-17 on one, and its evaluation 1-4 more.
set -euo pipefail
TASK=${1:?usage: scripts/reproduce-tasks.sh poly|induction|humaneval}
CORPUS=$TASK; MAKE_CORPUS=corpus-$TASK
case "$TASK" in
  poly) SEQ=${SEQ:-256}; EVAL_ARGS=(--per-count "${PER_COUNT:-200}" --counts 1-10) ;;
  induction) SEQ=${SEQ:-512}; EVAL_ARGS=(--stories "${STORIES:-200}") ;;
  # the programs run under bubblewrap; without it, SANDBOX_ARGS=--allow-unsandboxed-execution opts in to the guard
  humaneval) SEQ=${SEQ:-512}; EVAL_ARGS=(--max-bytes "${MAX_BYTES:-256}" ${SANDBOX_ARGS:-}); HEADS=${HEADS:-"1 8"}
             CORPUS=stdlib; MAKE_CORPUS=corpus ;;
  *) echo "unknown task $TASK: choose poly, induction or humaneval" >&2; exit 2 ;;
esac
STEPS=${STEPS:-800}; WIDTH=${WIDTH:-128}; LAYERS=${LAYERS:-10}; BATCH=${BATCH:-$((4096 / SEQ))}
HEADS=${HEADS:-"1 2 4 8"}; OUT=${OUT:-runs/repro-$TASK}
PYTHON=${PYTHON:-python3}
B="$PYTHON -m bytemtp_cli"
make "$MAKE_CORPUS" PYTHON="$PYTHON"
mkdir -p "$OUT"
for n in $HEADS; do
  run="$OUT/n$n"
  if ! ls "$run/checkpoints" 2>/dev/null | grep -q "^step-0*$STEPS$"; then
    rm -rf "$run"
    $B train --preset small --data "data/corpus/$CORPUS" --out "$run" --steps "$STEPS" \
      --set model.n_future="$n" --set model.d_model="$WIDTH" --set model.n_layers="$LAYERS" \
      --set model.seq_len="$SEQ" --set data.batch_size="$BATCH" --set train.eval_every=0 \
      --set train.eval_batches=20 --set train.ckpt_every="$STEPS"
  fi
  $B eval-task "$TASK" --ckpt "$run" "${EVAL_ARGS[@]}" --json "$run/task.json"
done
$PYTHON - "$OUT" $HEADS <<'EOF'
import json, sys
out, heads = sys.argv[1], sys.argv[2:]
rows = {}
for n in heads:
    task = json.load(open(f"{out}/n{n}/task.json"))
    val = [json.loads(line) for line in open(f"{out}/n{n}/metrics.jsonl") if '"val_bpb"' in line][-1]
    if "pass_at_k" in task:  # humaneval
        rows[n] = {**task["pass_at_k"], **task["shares"], "bytes_per_forward": task["decoding"]["bytes_per_forward"],
                   "val_bpb_h1": val["val_bpb"][0], "step": val["step"]}
        continue
    scores = task["answer_scores"].values()
    byte_acc = sum(s["byte_accuracy"] * s["bytes"] for s in scores) / sum(s["bytes"] for s in scores)
    rows[n] = {"accuracy": task["accuracy"], "overall": task["overall"], "answer_byte_accuracy": byte_acc,
               "val_bpb_h1": val["val_bpb"][0], "step": val["step"]}
json.dump(rows, open(f"{out}/summary.json", "w"), indent=2)
if "pass@1" in next(iter(rows.values())):
    print("n_future | val bpb h1 | pass@1 | passed | failed | timed out | did not parse | bytes/pass")
    for n, r in rows.items():
        print(f"{n} | {r['val_bpb_h1']:.3f} | {r['pass@1']:.4f} | " + " | ".join(
            f"{r[v]:.3f}" for v in ("passed", "failed", "timed out", "did not parse")) + f" | {r['bytes_per_forward']:.2f}")
    sys.exit()
groups = list(next(iter(rows.values()))["accuracy"])
print("n_future | val bpb h1 | exact match: " + " | ".join(groups) + " | all | answer byte acc")
for n, r in rows.items():
    print(f"{n} | {r['val_bpb_h1']:.3f} | " + " | ".join(f"{r['accuracy'][g]:.3f}" for g in groups)
          + f" | {r['overall']:.3f} | {r['answer_byte_accuracy']:.3f}")
EOF
