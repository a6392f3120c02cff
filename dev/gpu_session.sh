#!/usr/bin/env bash
# One lent GPU session, everything that no CPU shows, in one command that ends inside BUDGET seconds:
#   A. alone on the card: bench.py's GPU table (bf16 autocast, SDPA beside each causal attention), then torch.compile;
#   B. together (CUDA MPS where it starts): the suite on CUDA, and recall runs in priority order (the GPT's MQAR
#      recipe over seeds, float16 beside bfloat16, (256 tokens, 16 pairs), then Zoology's grid), no run started
#      after STOP and every run stopped at END (log.jsonl keeps its curve).
# Writes $OUT/results.tgz (logs, metrics.json, log.jsonl, speed tables; no checkpoints) and prints a summary.
#     OUT=/tmp/g bash dev/gpu_session.sh              # on the GPU machine
#     OUT=/tmp/g SMOKE=1 bash dev/gpu_session.sh      # a check on a CPU: tiny sizes, seconds
# Knobs for a later session: TABLE=0 skips the speed table, COMPILE_S (seconds for each model's torch.compile),
# RECIPES=0 skips the GPT's recipe runs (1 and 2 below), ZOO_WIDTHS (the grid's widths, in order). Wheels in .whl/
# (datasets, which the image lacks) are installed first where present.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}; W=$OUT/w; mkdir -p "$W/runs"
T0=$(date +%s); BUDGET=${BUDGET:-540}; SMOKE=${SMOKE:-0}; JOBS=${JOBS:-12}; PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
TABLE=${TABLE:-1}; COMPILE_S=${COMPILE_S:-100}; RECIPES=${RECIPES:-1}; ZOO_WIDTHS=${ZOO_WIDTHS:-"64 128"}
if ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
at() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$W/timeline.txt"; }
if [ "$SMOKE" = 1 ]; then
    DEV=cpu; LENGTHS=64,128; N=(--recall_sizes 300,50,50); S1=30; S2=30; S3=20; CUT=1; BUDGET=${BUDGET_SMOKE:-150}
    BENCH=(--n_embd 32 --dtype bfloat16); TESTS=(tests/test_layers.py); MODELS6=simpletron,softmax,transject,causal_simple_attention,causal_softmax_attention
else
    DEV=cuda; LENGTHS=1024,2048,4096,8192,16384; N=(); S1=3000; S2=8000; S3=2000; CUT=0; BENCH=(); TESTS=(-v --timeout 120 -n ${TEST_WORKERS:-4} tests)
    MODELS6=simpletron,softmax,transject,diffeqformer,causal_simple_attention,causal_softmax_attention
fi
E3=$(( S3 < 500 ? S3 : 500 ))                               # a run stopped at END keeps a val accuracy
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; "$PY" -c "import torch; print(torch.__version__)"; } \
    > "$W/env.txt" 2>&1
at "start"

# data first (CPU only, in parallel): every MQAR setting the runs below read
for s in 64,4,128 256,16,128 64,4,8192 128,8,8192 256,16,8192 512,64,8192; do
    IFS=, read -r L P V <<< "$s"
    [ "$SMOKE" = 1 ] && [ "$L" -gt 128 ] && L=128
    "$PY" -m tasks.recall --task mqar --recall_len "$L" --recall_pairs "$P" --recall_vocab "$V" "${N[@]}" \
        --cache_dir "$W/data" > "$W/data-$L-$P-$V.log" 2>&1 &
done
wait
at "data made"

# A. the speed table alone on the card, then torch.compile (RUNS_ONLY=1: the recall runs alone)
[ "${RUNS_ONLY:-0}" = 1 ] || [ "$TABLE" = 0 ] || timeout $((BUDGET / 4)) "$PY" bench.py --device $DEV --lengths $LENGTHS --repeats 3 --models $MODELS6 "${BENCH[@]}" \
    --out "$W/speed-gpu" > "$W/bench.log" 2>&1; at "bench rc=$?"
for m in simpletron softmax; do                              # one model a command: a timeout loses only that one
    [ "${RUNS_ONLY:-0}" = 1 ] || timeout "$COMPILE_S" "$PY" bench.py --device $DEV --compile --lengths ${LENGTHS%%,*} \
        --repeats 3 --models $m "${BENCH[@]}" --out "$W/compile-$m" > "$W/compile-$m.log" 2>&1; at "compile $m rc=$?"
done

# B. everything else at once
if [ "$DEV" = cuda ] && nvidia-cuda-mps-control -d 2>/dev/null; then
    timeout 30 "$PY" -c "import torch; torch.zeros(1, device='cuda').sum().item()" \
        && at "MPS on" || { echo quit | nvidia-cuda-mps-control; at "MPS failed: off"; }
fi
(while true; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> "$W/util.txt" 2>&1; sleep 10; done) &
UTIL=$!
export STOP=$((T0 + BUDGET - 90)) END=$((T0 + BUDGET - 25)) W PY DEV
[ "${RUNS_ONLY:-0}" = 1 ] && TESTS=(tests/test_layers.py)
(OMP_NUM_THREADS=1 timeout $((END - $(date +%s))) "$PY" -m pytest -p no:cacheprovider -rfE "${TESTS[@]}" > "$W/suite.log" 2>&1; at "suite rc=$?") &
SUITE=$!

RECIPE="--task mqar --n_layer 2 --warmup 100 --schedule cosine --min_lr 0 --weight_decay 0.1 --beta2 0.999 --grad_clip 1.0 \
--dropout 0.0 --eval_iters 20 --device $DEV"
GPT="--model softmax --norm pre --n_head 1"
declare -A M=([softmax]="$GPT" [simpletron]="--model simpletron --n_head 1" [transject]="--model transject" \
              [diffeqformer]="--model diffeqformer --n_head 1 --time_dim 8")
declare -A LR=([softmax]=5e-4 [simpletron]=5e-4 [transject]=2e-3 [diffeqformer]=2.5e-4)
tiny() { [ "$SMOKE" = 1 ] && echo "--n_embd 16" ; }
{
  [ "$RECIPES" = 1 ] && {
  # 1. the GPT's recipe over seeds (float32, as on the CPU), 64 tokens 4 pairs, width 64, vocabulary 128
  for seed in 0 1 2 3 4 5; do for lr in 5e-4 1e-3; do
    echo "gpt-L64-P4-d64-lr$lr-s$seed $RECIPE $GPT --recall_len 64 --recall_pairs 4 --recall_vocab 128 --n_embd 64 \
--batch_size 64 --lr $lr --seed $seed --max_iters $S1 --eval_interval 500 --dtype float32 $(tiny)"
  done; done
  for dt in float16 bfloat16; do                              # T4's precision (GradScaler) beside bf16's
    echo "gpt-L64-P4-d64-lr5e-4-s0-$dt $RECIPE $GPT --recall_len 64 --recall_pairs 4 --recall_vocab 128 --n_embd 64 \
--batch_size 64 --lr 5e-4 --seed 0 --max_iters $S1 --eval_interval 500 --dtype $dt $(tiny)"
  done
  # 2. (256 tokens, 16 pairs): the GPT at widths 64 and 128, vocabulary 128 and 8192, batch 64
  for w in 128 64; do for V in 128 8192; do for lr in 5e-4 1e-3; do
    L=256; [ "$SMOKE" = 1 ] && L=128
    echo "gpt-L256-P16-V$V-d$w-lr$lr $RECIPE $GPT --recall_len $L --recall_pairs 16 --recall_vocab $V --n_embd $w \
--batch_size 64 --lr $lr --max_iters $S2 --eval_interval 1000 $(tiny)"
  done; done; done
  }
  # 3. Zoology's grid, vocabulary 8192, 32,768 tokens a step, each model at its recall learning rate
  for w in $ZOO_WIDTHS; do for s in 64,4 128,8 256,16 512,64; do for m in softmax simpletron diffeqformer transject; do
    L=${s%,*}; P=${s#*,}; B=$((32768 / L)); [ "$SMOKE" = 1 ] && { [ "$L" -gt 128 ] && L=128; B=8; }
    echo "zoo-$m-L$L-P$P-d$w-lr${LR[$m]} $RECIPE ${M[$m]} --recall_len $L --recall_pairs $P --recall_vocab 8192 --n_embd $w \
--batch_size $B --lr ${LR[$m]} --max_iters $S3 --eval_interval $E3 $(tiny)"
  done; done; done
  # 4. the grid at width 256, then each point at a second learning rate (Zoology keeps the best of four)
  declare -A LR2=([softmax]=1e-3 [simpletron]=1e-3 [transject]=1e-3 [diffeqformer]=1e-3)
  for w in 256 64 128; do for s in 64,4 128,8 256,16 512,64; do for m in softmax simpletron diffeqformer transject; do
    L=${s%,*}; P=${s#*,}; B=$((32768 / L)); lr=${LR[$m]}; [ $w != 256 ] && lr=${LR2[$m]}
    [ "$SMOKE" = 1 ] && { [ "$L" -gt 128 ] && L=128; B=8; }
    echo "zoo-$m-L$L-P$P-d$w-lr$lr $RECIPE ${M[$m]} --recall_len $L --recall_pairs $P --recall_vocab 8192 --n_embd $w \
--batch_size $B --lr $lr --max_iters $S3 --eval_interval $E3 $(tiny)"
  done; done; done
} | sed 's/ *$//' | awk -v cut=$CUT '!cut || NR % 4 == 1' | sed "s|--task mqar|--task mqar --cache_dir $W/data|" > "$W/jobs.txt"
[ "$SMOKE" = 1 ] && sed -i "s|--task mqar|--task mqar ${N[*]}|" "$W/jobs.txt"
run() {
    local name=$1; shift; local now; now=$(date +%s)
    [ "$now" -lt "$STOP" ] || { echo "$name" >> "$W/skipped.txt"; return 0; }
    timeout $((END - now)) "$PY" train.py "$@" --out_dir "$W/runs/$name" > "$W/runs/$name.log" 2>&1 \
        || echo "rc=$? $name" >> "$W/failed.txt"
    rm -f "$W/runs/$name/ckpt.pt" "$W/runs/$name/best.pt"
}
export -f run
xargs -P "$JOBS" -L1 bash -c 'run "$@"' _ < "$W/jobs.txt"
at "runs done"
wait $SUITE; kill $UTIL 2>/dev/null
tail -3 "$W/suite.log" | tee -a "$W/timeline.txt"
"$PY" - "$W" <<'EOF' | tee "$W/summary.txt"
import glob, json, os, sys
w = sys.argv[1]
for d in sorted(glob.glob(os.path.join(w, "runs", "*/"))):
    name, m = os.path.basename(d.rstrip("/")), None
    if os.path.exists(d + "metrics.json"):
        m = json.load(open(d + "metrics.json"))
    rows = [json.loads(l) for l in open(d + "log.jsonl")] if os.path.exists(d + "log.jsonl") else []
    train = [r for r in rows if "acc" in r and "loss" in r]
    val = [r for r in rows if "val_acc" in r]
    first99 = next((r["step"] for i, r in enumerate(train) if i >= 49 and
                    sum(x["acc"] for x in train[i - 49:i + 1]) / 50 >= 0.99), None)
    last = train[-1]["step"] if train else 0
    print(f"{name:40s} step {last:5d} " + (f"test {100 * m['test_acc']:6.2f} {m['seconds']:6.0f} s " if m else "unfinished ")
          + (f"val {100 * val[-1]['val_acc']:6.2f} " if val else "") + f"99%@{first99}")
EOF
tar czf "$OUT/results.tgz" -C "$W" --exclude='*.pt' --exclude=data .
at "end"
