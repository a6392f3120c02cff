#!/usr/bin/env bash
# Zoology's own MQAR grid for the four models on one GPU: vocabulary 8,192, widths 64, 128, 256, 512, the settings
# (64 tokens, 4 pairs), (128, 8), (256, 16), (512, 64) of Zoology's Figure 2; 100,000 training and 3,000 test
# examples; 2 layers, one head; the recall tables' recipe (docs/recall.md), 32,768 tokens a step (Zoology's batch:
# 512 at 64 tokens, 64 at 512); each model at the learning rates LRS, the best by val accuracy kept for each point,
# as Zoology does. Several runs share the GPU at once (JOBS).
#
#     OUT=out/recall-gpu bash experiments/recall_gpu.sh          # writes $OUT/runs/*/metrics.json, $OUT/recall_gpu.md
#
# A tiny check on a CPU: OUT=/tmp/g DEVICE=cpu STEPS=10 WIDTHS=16 SETTINGS="16,2" SIZES=200,50,50 VOCAB=64 \
#     TOKENS=256 LRS="1e-3 2e-3" JOBS=2 bash experiments/recall_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder for the results}
DEVICE=${DEVICE:-cuda}; JOBS=${JOBS:-16}; STEPS=${STEPS:-1500}; VOCAB=${VOCAB:-8192}; TOKENS=${TOKENS:-32768}
WIDTHS=${WIDTHS:-"64 128 256 512"}; LRS=${LRS:-"2.5e-4 5e-4 1e-3 2e-3"}; SETTINGS=${SETTINGS:-"64,4 128,8 256,16 512,64"}; SIZES=${SIZES:-100000,1000,3000}
PY=${PYTHON:-python}
mkdir -p "$OUT/runs"
for s in $SETTINGS; do                                       # the data first, one setting a process
    "$PY" -m tasks.recall --task mqar --recall_len "${s%,*}" --recall_pairs "${s#*,}" --recall_vocab "$VOCAB" \
        --recall_sizes "$SIZES" --cache_dir "$OUT/data" > /dev/null &
done
wait
MODELS=("softmax --norm pre --n_head 1" "simpletron --n_head 1" "transject" "diffeqformer --n_head 1 --time_dim 8")
for s in $SETTINGS; do
    L=${s%,*}; P=${s#*,}
    for w in $WIDTHS; do
        for m in "${MODELS[@]}"; do
          for lr in $LRS; do
            name="${m%% *}-d$w-L$L-P$P-lr$lr"
            [ -f "$OUT/runs/$name/metrics.json" ] && continue          # done before: a rerun does the rest
            rm -rf "$OUT/runs/$name"
            echo "$PY train.py --task mqar --recall_len $L --recall_pairs $P --recall_vocab $VOCAB --recall_sizes $SIZES \
--cache_dir $OUT/data --model $m --lr $lr --n_embd $w --batch_size $((TOKENS / L)) --n_layer 2 --max_iters $STEPS --warmup 500 \
--schedule cosine --min_lr 0 --weight_decay 0.1 --beta2 0.999 --grad_clip 1.0 --dropout 0.0 --eval_interval $STEPS --eval_iters 4 \
--device $DEVICE --out_dir $OUT/runs/$name > $OUT/runs/$name.log 2>&1 || echo failed: $name"
          done
        done
    done
done | xargs -P "$JOBS" -I{} sh -c "{}"
"$PY" - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
rows, seconds, runs = {}, 0.0, 0
for path in sorted(glob.glob(os.path.join(out, "runs", "*", "metrics.json"))):
    m = json.load(open(path))
    a, c = m["args"], m["config"]
    seconds, runs = seconds + m["seconds"], runs + 1
    point = rows.setdefault((c["block_size"], a["recall_pairs"], c["n_embd"]), {})
    if m["model"] not in point or m["val_acc"] > point[m["model"]][0]:       # the best learning rate by val accuracy
        point[m["model"]] = (m["val_acc"], m["test_acc"], a["lr"])
models = ["softmax", "simpletron", "transject", "diffeqformer"]
lines = ["| length | pairs | width | " + " | ".join(models) + " |", "|---:|---:|---:|" + "---:|" * len(models)]
for (L, P, w), r in sorted(rows.items()):
    lines.append(f"| {L} | {P} | {w} | " + " | ".join(f"{100 * r[m][1]:.2f} (lr {r[m][2]:g})" if m in r else "–"
                                                     for m in models) + " |")
text = ("MQAR test accuracy per answer (%) at each model's best learning rate by val accuracy, one seed\n\n" +
        "\n".join(lines) + f"\n\n{runs} runs, {seconds / 60:.1f} min of run time together\n")
open(os.path.join(out, "recall_gpu.md"), "w").write(text)
print(text)
EOF
