#!/usr/bin/env bash
# The GPU evidence in benchmarks/results/, one stage per GPU-machine call (each well under 10 minutes).
#   OUT=out bash benchmarks/gpu_runs.sh bench        # dsnb bench, variants side by side on every GPU
#   OUT=out bash benchmarks/gpu_runs.sh advise       # dsnb advise for the 3B shape in a 15 GB cap, its top 3 measured
#   OUT=out bash benchmarks/gpu_runs.sh throughput   # the throughput mode alone from cold compile caches, with a
#                                                    # profiled step (REPEATS=2 HINTS=0 PROFILE=0 ROWS=16: 2
#                                                    # repeats, no perf-hints or profiled run, 16 rows a step;
#                                                    # the bench's: 12 rows of 1024 tokens)
#   OUT=out bash benchmarks/gpu_runs.sh fp8          # fp8 base weights (quantization fp8) against bf16 ones: the
#                                                    # throughput mode from cold compile caches, REPEATS (2) of each,
#                                                    # then the closed-book fast recipe; fp8 compiles for minutes cold
#                                                    # (fp8_h200.md), so one call each: PARTS=throughput REPEATS=1,
#                                                    # again, then PARTS=fast
#   OUT=out bash benchmarks/gpu_runs.sh fp8quality   # LoRA on fp8 base weights against bf16 ones on the quality task:
#                                                    # held-out exact match and F1, REPEATS (4) of each, interleaved
#                                                    # (benchmarks/fp8_quality.py)
#   LEVERS="ropecompute now" OUT=out bash benchmarks/gpu_runs.sh levers   # throughput_levers.py levers side by side,
#                                                    # each from a cold compile cache (PROFILE=1: then a profiled step of
#                                                    # the last lever from its warm cache, its kernels' sources kept)
#   OUT=out bash benchmarks/gpu_runs.sh fp8head      # the LM head in fp8 too (throughput_levers.py fp8head) beside
#                                                    # bf16's throughput mode (LEVERS="fp8 fp8head": beside fp8's;
#                                                    # any throughput_levers.py levers: fp8exact, fp8fastfwd)
#   OUT=out bash benchmarks/gpu_runs.sh chunkloss    # the loss chunked (loss_chunk) against whole logits: the
#                                                    # throughput mode and the colab_t4 recipe (PARTS="throughput
#                                                    # t4" by default; t4fast: its compiled fast recipe;
#                                                    # b1: the throughput mode's settings on the 1B shape;
#                                                    # rows24: 24 rows a micro-batch, chunked)
#   OUT=out bash benchmarks/gpu_runs.sh matmuls      # the throughput mode's frozen-weight matmuls alone, separate and
#                                                    # fused (q/k/v, gate/up), cuBLAS bf16 (benchmarks/matmul_shapes.py)
#   OUT=out bash benchmarks/gpu_runs.sh flexblocks   # the throughput mode's attention alone: 128- against 64-token
#                                                   # blocks, default against autotuned kernel configs
#   OUT=out bash benchmarks/gpu_runs.sh fp8gemms     # the frozen matmuls of a throughput step alone, bf16 against
#                                                    # fp8's forms (rowwise, tensorwise, fast accumulation)
#   OUT=out bash benchmarks/gpu_runs.sh peers        # HF Trainer + compile, TRL + Liger and Unsloth on the bench's task
#                                                    # beside dsnb (benchmarks/peers.py): PARTS=b8 (default), then
#                                                    # PARTS=packed in a second call
#   OUT=out bash benchmarks/gpu_runs.sh multi        # ZeRO 1/2/3 on 1 vs 2 GPUs; DeepSpeed's launcher
#   OUT=out bash benchmarks/gpu_runs.sh capacity     # the capacity map
#   OUT=out bash benchmarks/gpu_runs.sh zero3        # the map's 1B and 3B ZeRO-3 + CPU offload cells alone
#   OUT=out bash benchmarks/gpu_runs.sh big          # 8B LoRA + ZeRO-3 offload: under 15 GB, and its map cell
#                                                    # (ONLY15=1 STEPS=12: the 15 GB run alone, 12 steps)
#   OUT=out bash benchmarks/gpu_runs.sh nvme         # ZeRO-3 with parameters and optimizer on disk
#   OUT=out bash benchmarks/gpu_runs.sh notebook01   # notebook 01 under colab_t4 to its last cell, saved models reloaded
#   OUT=out bash benchmarks/gpu_runs.sh notebook01rerun  # the same killed after its pair finished, run all again in a
#                                                    # wiped runtime: the second pass trains nothing of the pair
#   OUT=out bash benchmarks/gpu_runs.sh colab        # notebook 01 under the colab_t4 preset (GPU 0) beside the T4
#                                                    # fast recipe in fp16 and compiled DeepSpeed variants (GPU 1)
#   OUT=out bash benchmarks/gpu_runs.sh t4drop       # the T4 fast recipe compiled in fp16: inductor's dropout masks, then dsnb's
#   OUT=out bash benchmarks/gpu_runs.sh t4pad        # colab_t4's 8-bit recipe padded to max_length, longest, bucket (and
#                                                    # longest 8 x 1), same samples and steps; bitsandbytes' 8-bit matmul
#                                                    # alone at each padding's shapes (benchmarks/bnb_shapes.py)
#   OUT=out bash benchmarks/gpu_runs.sh speed        # the bench's compiled ZeRO and full fine-tuning variants
#   OUT=out bash benchmarks/gpu_runs.sh last         # the same, one `dsnb run` each, with stacks of a hung step
#   OUT=out bash benchmarks/gpu_runs.sh profile      # one profiled step of the LoRA recipes that miss their targets
#   OUT=out bash benchmarks/gpu_runs.sh fast         # the fast recipe: Trainer, compiled, compiled ZeRO-2; host split
#   OUT=out bash benchmarks/gpu_runs.sh zero2knobs   # compiled LoRA ZeRO-2 with DeepSpeed's per-step checks turned off
#   ONLY=a,b OUT=out bash benchmarks/gpu_runs.sh scale8b  # 8B full fine-tuning on 1 and 2 GPUs (variants/scale_8b.yaml;
#                                                    # ONLY picks its cells: all of them take longer than one call;
#                                                    # BATCH=16 another micro-batch per GPU; PHASES=1 DeepSpeed's
#                                                    # per-phase timers, to explain a scaling above 100%)
#   OUT=out bash benchmarks/gpu_runs.sh scale4       # 8B full fine-tuning on 1, 2 and 4 GPUs, ZeRO-2/3, phase timers
#   OUT=out bash benchmarks/gpu_runs.sh rows         # the throughput mode's rows: 24x512, 12x1024, 6x2048 tokens;
#                                                    # 24x512 on the closed-book prompt (each a cold compile)
#   OUT=out bash benchmarks/gpu_runs.sh zerographs   # compiled LoRA: no DeepSpeed, ZeRO-2 with DeepSpeed's host syncs on
#                                                    # and off, ZeRO-1 without gradient hooks (VARIANTS: some of them)
#   OUT=out bash benchmarks/gpu_runs.sh graphscheck  # compiled steps with CUDA graphs and without at grad_accum 2
#                                                    # (VARIANTS="z2_fp16 z2_fp16_nographs": ZeRO-2 in fp16)
#   OUT=out bash benchmarks/gpu_runs.sh deepcompile  # full fine-tuning under compiled ZeRO-3, DeepSpeed's DeepCompile
#                                                    # against engine.compile(); VARIANTS="offload offload_dc": in 15 GB
#                                                    # (offload_dc failed on the H200 and preflight now refuses it)
# Every command has its own time limit and each stage ends by listing every run in its MLflow store, so a
# stage cut short still reports what finished.
# Results land in $OUT (copy them into benchmarks/results/); MLflow stores stay on the machine.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
DB=sqlite:////tmp/dsnb_gpu/mlflow.db
mkdir -p /tmp/dsnb_gpu
dump() { python3 benchmarks/dump_runs.py "$DB" --tails "$OUT/tails_$1.txt" 2>/dev/null > "$OUT/runs_$1.jsonl"
         python3 -c "import json,sys; [print(r['name'], r['status'], r['metrics'].get('samples_per_second'), r['metrics'].get('peak_gpu_allocated_mb'), r['metrics'].get('peak_cpu_rss_mb')) for r in map(json.loads, open(sys.argv[1]))]" "$OUT/runs_$1.jsonl"; }
# DeepSpeed's op builder cannot parse arch names such as "9.0a" in TORCH_CUDA_ARCH_LIST (this image's); for the ops it
# builds at run time (NVMe I/O, DeepCompile's) give it the GPU's own (dsnb's preflight refuses the other, saying so).
own_arch() { echo "TORCH_CUDA_ARCH_LIST was '${TORCH_CUDA_ARCH_LIST:-}'"
             export TORCH_CUDA_ARCH_LIST=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1); }
# One throughput_levers.py lever in a fresh process from a cold compile cache of its own, stopped after $2 s
lever() { TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_lever_$1 timeout "$2" python3 benchmarks/throughput_levers.py "$1" \
            --out "$OUT/throughput_levers.jsonl" --tracking_uri "$DB" > "$OUT/lever_$1.log" 2>&1
          echo "$1 exit $?: $(tail -1 "$OUT/lever_$1.log")"; }
prebuild() { python3 -c "import sys; from dsnb.model import resolve_model; [resolve_model(m) for m in sys.argv[1:]]" "$@"; }
# One bench variant (dsnb/bench.yaml) as `dsnb run` flags, with the bench's own: untimed and timed steps, a loss
# record a step, no model saved, no questions asked.
bench_flags() { echo "-f dsnb/bench.yaml --variant $1 --untimed_steps $2 --max_steps $(($2 + $3)) --logging_steps 1" \
                     "--save_model false --eval_samples 0 --experiment dsnb_bench"; }
B3=(--model synthetic:llama-3.2-3b --dataset synthetic --save_model false --tracking_uri "$DB")
# The fast recipe in fp16 as a Colab T4 runs it (the colab_t4 preset): the colab and t4drop stages
T4_FAST=("${B3[@]}" --preset colab_t4 --quantization none --padding bucket --batch_size 8 --grad_accum 1 --max_steps 40
         --untimed_steps 10 --logging_steps 1 --eval_samples 0 --experiment t4_fast)

[ $# -gt 0 ] || set -- usage
for stage in "$@"; do
case "$stage" in
bench)
  prebuild synthetic:llama-3.2-3b
  timeout 500 python3 -m dsnb bench --gpus "$GPUS" --repeats 3 --untimed 3 --steps 6 --out "$OUT" --tracking_uri "$DB"
  dump bench
  ;;
advise)  # the tutorial's task on the 3B shape in a T4's 15 GB: every variant ranked, then the top 3 that fit run for
  # 10 steps each (--verify), measured beside predicted: each run compiles for 2-3 minutes cold (advise_verify_h200.md:
  # 134 and 196 s for the first two), so give the call all of its 10 minutes (VERIFY=2: two, where less is left)
  prebuild synthetic:llama-3.2-3b
  timeout "${LIMIT:-560}" python3 -m dsnb advise "${B3[@]}" --memory_budget_gb 15 --gpus 1 --verify "${VERIFY:-3}" --top 30 \
    > "$OUT/advise.txt" 2> "$OUT/advise.log"
  echo "advise exit $?"; head -40 "$OUT/advise.txt"
  dump advise
  ;;
throughput)  # the throughput mode alone, each repeat a fresh process with a cold compile cache (as a user's first run),
  # one at a time (compiling beside a timed run would slow it); ROWS: another count of rows a step (the bench's: 12
  # of 1024 tokens)
  prebuild synthetic:llama-3.2-3b
  for rep in $(seq "${REPEATS:-3}"); do
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cold_$rep timeout 200 python3 -m dsnb run \
      $(bench_flags throughput_compiled 8 12) ${ROWS:+--batch_size $ROWS} --tracking_uri "$DB" \
      --run_name "throughput_compiled_cold$rep" > "$OUT/throughput_cold$rep.log" 2>&1
    echo "cold repeat $rep exit $?: $(grep -E '^  speed' "$OUT/throughput_cold$rep.log")"
  done
  [ "${PROFILE:-1}" = 0 ] || timeout 200 python3 -m dsnb run $(bench_flags throughput_compiled 8 2) \
    ${ROWS:+--batch_size $ROWS} --profile "$OUT/profile_throughput_compiled.txt" --tracking_uri "$DB" \
    --run_name profiled > "$OUT/profiled.log" 2>&1
  [ "${HINTS:-1}" = 1 ] || { dump throughput; continue; }  # HINTS=0: no perf-hints run
  # Why a step does or does not run as CUDA graphs: inductor's perf hints name each skipped graph and the reason.
  TORCH_LOGS=perf_hints timeout 200 python3 -m dsnb run $(bench_flags throughput_compiled 4 2) \
    --tracking_uri "$DB" --run_name perf_hints > "$OUT/throughput_perf_hints.log" 2>&1
  grep -i "cudagraph" "$OUT/throughput_perf_hints.log" | sort | uniq -c | head -20
  dump throughput
  ;;
fp8)  # FP8 frozen base weights (dsnb/fp8.py) against bf16 weights, side by side, one run at a time: the throughput mode,
  # each repeat a fresh process with a cold compile cache, bf16 and fp8 alternating; then the fast recipe on the
  # closed-book prompt (fast_compiled, --prompt eos) in each. Every run logs its loss at every step: the listing's loss
  # curves compare the two over the same steps and batches. A cold pair took 366 s on a new H100 (fp8_fast_h100.md):
  # REPEATS=2 does not fit a call's 10 minutes there
  prebuild synthetic:llama-3.2-3b
  fp8_run() { local name=$1 weights=$2 limit=$3; shift 3
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_$name timeout "$limit" python3 -m dsnb run "$@" --quantization "$weights" \
      --tracking_uri "$DB" --experiment dsnb_fp8 --run_name "$name" > "$OUT/$name.log" 2>&1
    echo "$name exit $?: $(grep -E '^  speed' "$OUT/$name.log")"; }
  if [[ "${PARTS:-throughput fast}" == *throughput* ]]; then
    for rep in $(seq "${REPEATS:-2}"); do
      for weights in none fp8; do
        fp8_run "throughput_${weights/none/bf16}_cold$rep" "$weights" 300 $(bench_flags throughput_compiled 8 12)
      done
    done
  fi
  if [[ "${PARTS:-throughput fast}" == *fast* ]]; then
    for weights in none fp8; do
      fp8_run "fast_eos_${weights/none/bf16}" "$weights" 240 $(bench_flags fast_compiled 8 24) --prompt eos
    done
  fi
  dump fp8
  ;;
fp8quality)  # the quality preset's base trained 60 steps, then LoRA from it with bf16 and fp8 base weights, held out
  timeout "${LIMIT:-540}" python3 benchmarks/fp8_quality.py --out "$OUT/fp8_quality" --repeats "${REPEATS:-4}" \
    --tracking_uri "$DB" > "$OUT/fp8_quality.md" 2> "$OUT/fp8_quality.err"
  echo "fp8_quality exit $?"; cat "$OUT/fp8_quality.md"
  dump fp8quality
  ;;
peers)  # the peers' LoRA fine-tuning of the bench's task as each runs it (benchmarks/peers.py: HF Trainer + compile, TRL
  # + Liger, Unsloth), each its own process, beside dsnb's in the same call. PARTS=b8: a batch of 8 (the tutorial's
  # effective batch) against dsnb's fast_compiled; PARTS=packed: samples packed into 12 rows of 1024 tokens against
  # dsnb's throughput mode; one call each (both exceed 10 minutes). Each peer is stopped after LIMIT s (a stopped one
  # is recorded FAILED with why); the listing and the table are written after each run, so a call cut short keeps
  # what finished. Needs .whl_peers (bash benchmarks/peer_wheels.sh) carried beside .whl
  prebuild synthetic:llama-3.2-3b
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/peers .whl_peers/*.whl \
    > /dev/null 2>&1 || { echo "no peers' wheels: run bash benchmarks/peer_wheels.sh and carry .whl_peers"; continue; }
  [ -f /tmp/peers_data.json ] || python3 benchmarks/peers.py data --out /tmp/peers_data.json
  peers_table() { dump peers > /dev/null
    python3 benchmarks/peers.py table "$OUT/peers.jsonl" "$OUT/runs_peers.jsonl" > "$OUT/peers.md"; }
  here=$PWD out=$(cd "$OUT" && pwd)
  peer() { local name=$1; shift  # from /tmp: Unsloth writes its compiled cache where it runs
    (cd /tmp && PYTHONPATH=/tmp/peers:${PYTHONPATH:-} HF_HUB_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1 \
      timeout -k 10 "${LIMIT:-110}" python3 "$here/benchmarks/peers.py" run "$@" --data /tmp/peers_data.json \
      --out "$out/peers.jsonl") > "$OUT/peer_$name.log" 2>&1
    echo "$name exit $?: $(tail -c 300 "$OUT/peer_$name.log" | tr '\n' ' ')"; peers_table; }
  dsnb_peer() { local name=$1 limit=$2; shift 2
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_$name timeout "$limit" python3 -m dsnb run "$@" --tracking_uri "$DB" \
      --run_name "$name" > "$OUT/$name.log" 2>&1
    echo "$name exit $?: $(grep -E '^  speed' "$OUT/$name.log")"; peers_table; }
  # dsnb's row first: the reference, kept however far the peers get in the call's 10 minutes
  if [[ "${PARTS:-b8}" == *b8* ]]; then
    dsnb_peer dsnb_fast_compiled_b8 180 $(bench_flags fast_compiled 20 30)
    for p in ${PEERS:-hf_compile trl_liger unsloth}; do peer "${p}_b8" "$p" --batch 8 --untimed 20 --steps 30; done
  fi
  if [[ "${PARTS:-b8}" == *packed* ]]; then  # FP8=1: dsnb's throughput mode with fp8 weights too (its MFU is of bf16's
    # peak); with both, one peer fits a call's 10 minutes (PEERS=unsloth, then PEERS=trl_liger)
    dsnb_peer dsnb_throughput_cold 220 $(bench_flags throughput_compiled 8 20)
    [ -z "${FP8:-}" ] || dsnb_peer dsnb_throughput_fp8_cold 240 $(bench_flags throughput_compiled 8 20) --quantization fp8
    for p in ${PEERS:-trl_liger unsloth}; do peer "${p}_packed" "$p" --batch 12 --packed --untimed 8 --steps 20; done
  fi
  cat "$OUT/peers.md"
  ;;
fp8head|levers)  # levers: any throughput_levers.py levers side by side (LEVERS="ropecompute now"). fp8head: the fp8 LM head lever (benchmarks/throughput_levers.py fp8head) beside the bf16 throughput mode in one call,
  # each a fresh process from a cold compile cache: LEVERS="now fp8head" (default) for the ratio to bf16, then
  # LEVERS="fp8 fp8head" for what the head alone adds and what fp8 logits do to the loss; any levers of
  # throughput_levers.py (fp8exact: fp32 accumulation, fp8fastfwd: fast in the forward only). Each lever is stopped
  # after LIMIT s (default 420: fp8head's cold compile on a new H100 took more than 260 s; on an H200 an fp8 lever's
  # run took 170-190 s from start to end, bf16's 114: fp8_accum_h200.md); the device call's own limit must cover them
  prebuild synthetic:llama-3.2-3b
  [ "$stage" = levers ] && [ -z "${LEVERS:-}" ] && { echo "levers: set LEVERS (throughput_levers.py's levers)"; continue; }
  for lever in ${LEVERS:-now fp8head}; do
    lever "$lever" "${LIMIT:-420}"
  done
  if [ "${PROFILE:-0}" = 1 ]; then  # the last lever's step profiled, compiled from its own cache, its kernels kept
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_lever_$lever timeout 200 python3 benchmarks/throughput_levers.py "$lever" \
      --untimed 4 --steps 2 --profile "$OUT/profile_$lever.txt" --tracking_uri "$DB" > "$OUT/profile_$lever.log" 2>&1
    echo "profile exit $?"; head -1 "$OUT/profile_$lever.txt"
    mkdir -p "$OUT/kernels_$lever"
    grep -rlE "def triton_(poi|red|per)_fused.*(cos|rsqrt|pow_sum|silu)" /tmp/inductor_lever_$lever --include=*.py |
      head -40 | xargs -r cp -t "$OUT/kernels_$lever"
  fi
  dump "$stage"
  ;;
chunkloss)  # the loss chunked (loss_chunk 1024, dsnb/loss.py) against whole logits, each run a fresh process:
  # PARTS=throughput: the throughput mode, levers now and chunk (throughput_levers.py), each from a cold compile cache;
  # t4: the colab_t4 preset's 8-bit recipe (the HF Trainer, fp16, bucket padding), 12 steps; t4fast: its fast recipe
  # compiled in fp16 (a batch of 8); b1: the throughput mode's settings on the 1B shape. The same samples and steps
  # with and without; peak memory, speed and loss. rows24: the throughput mode with 24 rows a micro-batch, chunked
  prebuild synthetic:llama-3.2-3b synthetic:llama-3.2-1b
  for part in ${PARTS:-throughput t4}; do
    if [ "$part" = rows24 ]; then  # 24 rows a micro-batch, loss chunked (whole logits would not fit 80 GB)
      lever chunk24 "${LIMIT:-300}"
      continue
    fi
    for chunk in ${CHUNKS:-0 1024}; do  # CHUNKS=1024: the chunked run alone
      case $part in
      throughput)
        lever "$([ "$chunk" = 0 ] && echo now || echo chunk)" "${LIMIT:-240}" ;;
      t4)
        timeout 100 python3 -m dsnb run "${B3[@]}" --preset colab_t4 --max_steps 12 --untimed_steps 3 --logging_steps 1 \
          --eval_samples 0 --experiment t4chunk --loss_chunk "$chunk" --run_name "t4_8bit_chunk$chunk" \
          > "$OUT/t4_8bit_chunk$chunk.log" 2>&1
        echo "t4 chunk $chunk exit $?" ;;
      b1)  # the throughput mode's settings on the 1B shape (16 layers against 3B's 28: another split of the memory
        # between the layers' activations and the logits), 3 untimed and 5 timed steps
        TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_b1_$chunk timeout 120 python3 -m dsnb run \
          $(bench_flags throughput_compiled 3 5) --model synthetic:llama-3.2-1b --tracking_uri "$DB" \
          --loss_chunk "$chunk" --run_name "b1_throughput_chunk$chunk" > "$OUT/b1_chunk$chunk.log" 2>&1
        echo "b1 chunk $chunk exit $?" ;;
      t4fast)
        TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_t4fast_$chunk timeout 150 python3 -m dsnb run "${T4_FAST[@]}" \
          --torch_compile true --loss_chunk "$chunk" --run_name "t4_fast_chunk$chunk" > "$OUT/t4_fast_chunk$chunk.log" 2>&1
        echo "t4fast chunk $chunk exit $?" ;;
      esac
    done
  done
  dump chunkloss
  ;;
matmuls)  # the 3B layer's matmuls at the throughput mode's 12,288 tokens: the MFU ceiling of matmuls alone
  timeout 120 python3 benchmarks/matmul_shapes.py > "$OUT/matmul_shapes_h200.json"; echo "matmul_shapes exit $?"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv >> "$OUT/matmul_shapes_smi.txt"
  ;;
flexblocks)  # the throughput mode's attention alone (benchmarks/flex_blocks.py): flex attention's forward and backward
  # on the bench's filled rows, 128- against 64-token blocks, inductor's default configs against autotuned ones, each
  # setting a fresh process from a cold compile cache of its own (~1-2 minutes in all)
  for s in ${SETTINGS:-128 128auto 64 64auto}; do
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_flex_$s timeout "${LIMIT:-150}" python3 benchmarks/flex_blocks.py "$s" \
      --out "$OUT/flex_blocks.jsonl" > "$OUT/flex_$s.log" 2>&1; echo "$s exit $?: $(tail -1 "$OUT/flex_$s.log")"
  done
  ;;
fp8gemms)  # a throughput step's frozen matmuls alone in bf16 and in each fp8 form (benchmarks/fp8_gemms.py; ~1 minute)
  python3 benchmarks/fp8_gemms.py --out "$OUT/fp8_gemms.jsonl" > "$OUT/fp8_gemms.txt" 2>&1
  echo "fp8_gemms exit $?"; tail -8 "$OUT/fp8_gemms.txt"
  ;;
multi)
  prebuild synthetic:llama-3.2-3b
  timeout 270 python3 -m dsnb capacity -f variants/multi_gpu_zero.yaml --gpus "$GPUS" --out "$OUT/multi_gpu" \
    --tracking_uri "$DB"
  # DeepSpeed's own launcher, as a team on a multi-GPU node would start a run (rank 0 logs it).
  timeout 75 python3 -m deepspeed.launcher.runner --num_gpus "$GPUS" --module dsnb run \
    -f variants/full_finetune_zero3_offload.yaml "${B3[@]}" --max_steps 4 --run_name deepspeed_launcher \
    > "$OUT/deepspeed_launcher.log" 2>&1
  echo "launcher exit $?"
  dump multi
  ;;
capacity)  # the whole capacity map (18 cells; on one GPU longer than one 10-minute call: see zero3 and big)
  prebuild synthetic:llama-3.1-8b synthetic:llama-3.2-3b synthetic:llama-3.2-1b
  timeout 590 python3 -m dsnb capacity -f variants/capacity_map.yaml --gpus "$GPUS" --out "$OUT/capacity" \
    --tracking_uri "$DB"
  dump capacity
  ;;
zero3)  # the capacity map's ZeRO-3 + CPU offload cells of 1B and 3B, measured again since they load into partitions
  prebuild synthetic:llama-3.2-3b synthetic:llama-3.2-1b
  timeout 300 python3 -m dsnb capacity -f variants/capacity_map.yaml --gpus "$GPUS" --out "$OUT/zero3" \
    --only lora_zero3_offload,full_zero3_offload,llama-3.2-1b,llama-3.2-3b --tracking_uri "$DB"
  dump zero3
  ;;
big)  # 8B with LoRA under ZeRO-3 + CPU offload: capped at 15 GB, then uncapped as its capacity-map cell
  prebuild synthetic:llama-3.1-8b
  timeout "${LIMIT:-110}" python3 -m dsnb run --model synthetic:llama-3.1-8b --dataset synthetic --save_model false \
    --tracking_uri "$DB" --quantization none --dtype bf16 --padding longest --batch_size 8 --grad_accum 1 \
    --strategy zero3 --offload_optimizer cpu --offload_param cpu --memory_budget_gb 15 --max_steps "${STEPS:-4}" \
    --eval_samples "${EVAL:-64}" --run_name 8b_lora_zero3_offload_15gb > "$OUT/8b_15gb.log" 2>&1
  echo "8b exit $?"
  [ -z "${ONLY15:-}" ] || { dump big; continue; }  # ONLY15=1: the 15 GB run alone (STEPS=12: more timed steps)
  timeout 150 python3 -m dsnb capacity -f variants/capacity_map.yaml --out "$OUT/big" \
    --only lora_zero3_offload,llama-3.1-8b --tracking_uri "$DB"
  dump big
  ;;
nvme)  # ZeRO-Infinity: parameters and optimizer states on disk. libaio travels as .debs, unpacked under /tmp;
       # fetch them once where packages can be fetched: mkdir -p .whl/aio && cd .whl/aio && apt-get download libaio1 libaio-dev
  prebuild synthetic:llama-3.2-1b
  for deb in .whl/aio/*.deb; do dpkg -x "$deb" /tmp/aio; done
  export CFLAGS="-I/tmp/aio/usr/include" LDFLAGS="-L/tmp/aio/usr/lib/x86_64-linux-gnu" CPATH=/tmp/aio/usr/include \
    LIBRARY_PATH=/tmp/aio/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=/tmp/aio/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  mkdir -p /tmp/nvme
  own_arch
  timeout 300 python3 -m dsnb run --model synthetic:llama-3.2-1b --dataset synthetic --save_model false \
    --tracking_uri "$DB" --quantization none --lora_r 0 --dtype bf16 --padding longest --batch_size 8 --grad_accum 1 \
    --strategy zero3 --offload_optimizer nvme --offload_param nvme --nvme_path /tmp/nvme --max_steps 3 \
    --run_name full_zero3_nvme_1b > "$OUT/nvme.log" 2>&1
  echo "nvme exit $?"
  dump nvme
  ;;
notebook01)  # notebook 01 as a Colab T4 user runs it (the colab_t4 preset, the synthetic 3B shape, 20 steps a variant, once
  # each), to its last cell; then each saved model reloaded against its run's own probe (8-bit base included)
  prebuild synthetic:llama-3.2-3b
  python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
  mkdir -p /tmp/nb01 && started=$SECONDS
  timeout "${LIMIT:-300}" python3 -m papermill notebooks/01_deepspeed_vs_baseline.ipynb "$OUT/notebook01_t4.ipynb" \
    -k python3 --cwd /tmp/nb01 -p preset colab_t4 -p model synthetic:llama-3.2-3b -p dataset synthetic \
    -p max_steps 20 -p repeats 1 -p eval_samples 16 > "$OUT/notebook01_t4.log" 2>&1
  echo "papermill exit $? in $((SECONDS - started)) s"
  (cd /tmp/nb01 && timeout 90 python3 "$OLDPWD/benchmarks/reload_parity.py" sqlite:////tmp/nb01/mlflow.db \
    adapter-* 2>/dev/null | tee "$OUT/reload_parity.jsonl")
  cp /tmp/nb01/adapter-*/README.md "$OUT/model_card_3b.md" 2>/dev/null
  DB=sqlite:////tmp/nb01/mlflow.db dump notebook01
  ;;
notebook01rerun)  # notebook 01 under colab_t4 killed in its quality check (the pair finished), the runtime wiped but
  # for the results folder, run all again: the second pass must train nothing of the pair (benchmarks/notebook_rerun.py)
  prebuild synthetic:llama-3.2-3b
  python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
  rm -rf /tmp/nb01rerun
  timeout "${LIMIT:-480}" python3 benchmarks/notebook_rerun.py "$OUT" /tmp/nb01rerun -p preset colab_t4 \
    -p model synthetic:llama-3.2-3b -p dataset synthetic -p max_steps 20 -p repeats 1 -p eval_samples 16
  ;;
colab)  # what a Colab T4 user runs, on an H200 under the T4 preset (fp16, 15 GB cap, 12.7 GB RAM check): it is no T4
  prebuild synthetic:llama-3.2-3b
  mkdir -p /tmp/nb01
  # GPU 0: notebook 01 with the synthetic 3B shape, short runs repeated (a verdict against the run-to-run spread)
  CUDA_VISIBLE_DEVICES=0 timeout 530 python3 -m papermill notebooks/01_deepspeed_vs_baseline.ipynb \
    "$OUT/notebook01_t4.ipynb" -k python3 --cwd /tmp/nb01 -p preset colab_t4 -p model synthetic:llama-3.2-3b \
    -p dataset synthetic -p max_steps 16 -p repeats 3 -p eval_samples 16 -p tracking_uri "$DB" \
    -p experiment notebook01_t4 > "$OUT/notebook01_t4.log" 2>&1 &
  # GPU 1: the fast recipe in fp16 as a T4 runs it, under the Trainer and compiled (loss scaler), same batches
  CUDA_VISIBLE_DEVICES=1 timeout 140 python3 -m dsnb run "${T4_FAST[@]}" --run_name t4_fp16_trainer > "$OUT/t4_trainer.log" 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout 170 python3 -m dsnb run "${T4_FAST[@]}" --torch_compile true --run_name t4_fp16_compiled \
    > "$OUT/t4_compiled.log" 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout 210 python3 -m dsnb bench --only fast_compiled,fast_zero2_compiled --repeats 1 \
    --untimed 4 --steps 8 --out "$OUT/bench_colab" --tracking_uri "$DB" > "$OUT/bench_colab.log" 2>&1
  wait
  dump colab
  ;;
speed)  # compiled DeepSpeed and full fine-tuning, two variants at a time (one per GPU), against the tutorial's recipe
  prebuild synthetic:llama-3.2-3b
  timeout 500 python3 -m dsnb bench --gpus "$GPUS" --repeats 1 --untimed 4 --steps 8 --out "$OUT/bench_speed" \
    --only tutorial,fast_compiled,fast_zero2_compiled,full_compiled,full_zero2_compiled,full_zero3_compiled,full_zero3_offload_15gb,fast_zero3_compiled \
    --tracking_uri "$DB" > "$OUT/bench_speed.log" 2>&1
  tail -20 "$OUT/bench_speed.log"
  dump speed
  ;;
last)  # one variant a command, each with its own limit, both GPUs busy; a hung first step dumps its Python stacks
  prebuild synthetic:llama-3.2-3b
  one() { local gpu=$1 name=$2 limit=$3; shift 3
    CUDA_VISIBLE_DEVICES=$gpu PYTHONFAULTHANDLER=1 timeout -s ABRT "$limit" python3 -m dsnb run \
      $(bench_flags "$name" 4 8) --tracking_uri "$DB" "$@" > "$OUT/$name.log" 2>&1
    echo "$name exit $?"; }
  T4=("${B3[@]}" --preset colab_t4 --quantization none --padding bucket --batch_size 8 --grad_accum 1 --max_steps 12
      --untimed_steps 4 --eval_samples 0 --experiment t4_fast --run_name t4_fp16_trainer_device_map)
  (one 0 fast_zero2_compiled 170; one 0 full_zero3_compiled 230
   CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m dsnb run "${T4[@]}" > /dev/null 2>&1; echo "t4 exit $?") &
  (one 1 full_zero2_compiled 170; one 1 full_zero3_offload_15gb 240; one 1 full 70) &
  wait
  dump last
  ;;
fast)  # the fast recipe's three ways side by side (the Trainer, compiled, compiled ZeRO-2), then the compiled step's
      # host time split by phase (benchmarks/host_split.py)
  prebuild synthetic:llama-3.2-3b
  timeout 470 python3 -m dsnb bench --only fast,fast_compiled,fast_zero2_compiled --repeats 2 --untimed 8 --steps 24 \
    --out "$OUT/bench_fast" --tracking_uri "$DB" > "$OUT/bench_fast.log" 2>&1
  tail -8 "$OUT/bench_fast.log"
  timeout 100 python3 benchmarks/host_split.py fast_compiled --out "$OUT/host_split_fast_compiled.json" > /dev/null 2>&1
  cat "$OUT/host_split_fast_compiled.json"
  dump fast
  ;;
zero2knobs)  # fast_zero2_compiled as dsnb built it before (bf16 overflow check and overlap_comm on), with the check off,
  # then also overlap_comm off (one GPU); CUDA graphs were off under DeepSpeed then: --cuda_graphs false as measured
  prebuild synthetic:llama-3.2-3b
  python3 benchmarks/zero_hooks_cpu.py --gpu-configs /tmp/ds
  for v in default nocheck nocheck_nooverlap; do
    config=$(case $v in default) echo z2_syncs;; nocheck) echo z2_nocheck;; *) echo z2_nosync;; esac)
    timeout 130 python3 -m dsnb run $(bench_flags fast_zero2_compiled 8 24) --cuda_graphs false \
      --ds_config_path "/tmp/ds/$config.json" --tracking_uri "$DB" --run_name "z2_$v" > "$OUT/z2_$v.log" 2>&1
    echo "$v exit $?"
  done
  dump zero2knobs
  ;;
profile)  # where a step of the fast recipe (target 400 samples/s) and of its ZeRO-2 twin (target 1.25x) goes
  prebuild synthetic:llama-3.2-3b
  for name in fast_compiled fast_zero2_compiled; do
    timeout 200 python3 -m dsnb run $(bench_flags "$name" 8 24) --profile "$OUT/profile_$name.txt" \
      --tracking_uri "$DB" --run_name "profile_$name" > "$OUT/profile_$name.log" 2>&1
    echo "$name exit $?"; head -1 "$OUT/profile_$name.txt"
  done
  dump profile
  ;;
scale8b)  # full fine-tuning of the 8B shape, ZeRO-2 and ZeRO-3, optimizer offloaded or not, on one GPU and on two
  prebuild synthetic:llama-3.1-8b
  # BATCH=16: another micro-batch per GPU, in an experiment and listing of its own
  [[ "${ONLY:-offload}" != *offload* ]] || { timeout 120 python3 -m dsnb prepare > "$OUT/prepare.log" 2>&1
                                             echo "prepare exit $?"; }  # CPU Adam, built once
  free -g | head -2
  timeout "${LIMIT:-480}" python3 -m dsnb capacity -f variants/scale_8b.yaml --out "$OUT/scale_8b${BATCH:+_b$BATCH}" \
    ${ONLY:+--only "$ONLY"} ${BATCH:+--batch_size "$BATCH" --experiment "dsnb_scale_8b_b$BATCH"} --tracking_uri "$DB" \
    ${PHASES:+--phase_times true} > "$OUT/scale_8b${BATCH:+_b$BATCH}.log" 2>&1
  echo "capacity exit $?"
  dump "scale8b${BATCH:+_b$BATCH}"
  ;;
scale4)  # 8B full fine-tuning on 1, 2 and 4 GPUs, ZeRO-2 and ZeRO-3, a micro-batch of 8 per GPU, with DeepSpeed's phase
  # timers (variants/scale_8b_4gpu.yaml; needs nvidia-h200-x4): efficiency and per-GPU memory, and where each step goes
  prebuild synthetic:llama-3.1-8b
  timeout "${LIMIT:-540}" python3 -m dsnb capacity -f variants/scale_8b_4gpu.yaml --phase_times true \
    ${ONLY:+--only "$ONLY"} --out "$OUT/scale_8b_4gpu" --tracking_uri "$DB" > "$OUT/scale_8b_4gpu.log" 2>&1
  echo "capacity exit $?"
  dump scale4
  ;;
zerographs)  # compiled LoRA at batch 8 under ZeRO-2 and ZeRO-1 (no hooks) replayed as CUDA graphs, beside the plain
  # compiled step; ZeRO-2 with DeepSpeed's per-step host syncs (bf16 overflow check, overlap_comm) on, as dsnb built it
  # before, and off ("nosync"); VARIANTS="fast_compiled zero2_flat zero2_stock ...": ZeRO-2 as dsnb builds it now,
  # with dsnb's flat step and with DeepSpeed's own (--zero_flat_step false); "full_flat full_stock": the same two steps for
  # full fine-tuning (the bench's full_zero2_compiled); a name ending in _2 is a repeat; PROFILE=name
  # profiles one. The older ZeRO variants now run with DeepSpeed's throughput timer off and, at ZeRO-1/2 in bf16, the
  # flat step, so they no longer reproduce benchmarks/results/archive/zero_graphs_h200.md's figures (measured before both)
  prebuild synthetic:llama-3.2-3b
  python3 benchmarks/zero_hooks_cpu.py --gpu-configs /tmp/ds
  for v in ${VARIANTS:-fast_compiled zero2_graphs zero2_nosync_graphs zero1_nohooks_nocheck_graphs fast_compiled_2 \
                       zero2_nosync_graphs_2}; do
    base=fast_zero2_compiled flags=() name=lora_$v
    [ "${v%_2}" != fast_compiled ] || base=fast_compiled
    [[ $v != full_* ]] || base=full_zero2_compiled name=$v  # full fine-tuning: full_flat, full_stock
    case ${v%_2} in zero1_nohooks_graphs) flags=(--strategy zero1 --ds_config_path /tmp/ds/z1_nohooks.json);;
      zero1_nohooks_nocheck_graphs) flags=(--strategy zero1 --ds_config_path /tmp/ds/z1_nohooks_nocheck.json);;
      zero2_graphs) flags=(--ds_config_path /tmp/ds/z2_syncs.json);;
      zero2_nosync_graphs) flags=(--ds_config_path /tmp/ds/z2_nosync.json);;
      zero2_stock|full_stock) flags=(--zero_flat_step false);; esac  # zero2_flat, full_flat: dsnb's flat ZeRO-2 step
    [ "$v" != "${PROFILE:-}" ] || flags+=(--profile "$OUT/profile_$name.txt")
    TORCH_LOGS=perf_hints timeout "${LIMIT:-200}" python3 -m dsnb run \
      $(bench_flags $base 8 24) "${flags[@]}" --tracking_uri "$DB" --experiment dsnb_zero_graphs \
      --run_name "$name" > "$OUT/$name.log" 2>&1
    echo "$v exit $?"; dump zerographs > /dev/null
  done
  dump zerographs
  ;;
graphscheck)  # CUDA graphs against none (--cuda_graphs false) where gradients are summed over 2 micro-batches: compiled
  # without DeepSpeed (its own .grad buffers) and ZeRO-2 (its buffers); VARIANTS="z2_fp16 z2_fp16_nographs" in a
  # second call: ZeRO-2 in fp16 (the T4's dtype, DeepSpeed's loss scaler; each cold 3B compile takes ~105 s, so the
  # six do not fit one call); the listing, with each run's loss curve, is rewritten after every run
  prebuild synthetic:llama-3.2-3b
  for v in ${VARIANTS:-plain_ga2 plain_ga2_nographs z2_ga2 z2_ga2_nographs}; do
    base=fast_zero2_compiled flags=()
    [[ $v != plain* ]] || base=fast_compiled
    [[ $v != *nographs ]] || flags+=(--cuda_graphs false)
    [[ $v != *ga2* ]] || flags+=(--grad_accum 2)
    [[ $v != *fp16* ]] || flags+=(--dtype fp16)
    timeout "${LIMIT:-150}" python3 -m dsnb run $(bench_flags $base 8 24) \
      "${flags[@]}" --tracking_uri "$DB" --experiment dsnb_graphs_check --run_name "$v" > "$OUT/$v.log" 2>&1
    echo "$v exit $?"; dump graphscheck > /dev/null
  done
  dump graphscheck
  ;;
deepcompile)  # full fine-tuning of the 3B shape under compiled ZeRO-3: plain torch.compile of DeepSpeed's module (its
  # fetch and release hooks between graphs) against DeepCompile (--deepcompile true: gathers, releases and prefetches
  # as operations in the graph, scheduled after its first 5 steps, which recompile); 8 untimed steps cover that.
  # Without offload (dc: the prefetch case), then in a second call the 15 GB variant with parameters and optimizer in
  # CPU RAM (offload_dc: DeepCompile moves parameters itself); compare speed and the loss curves in the listing
  prebuild synthetic:llama-3.2-3b
  own_arch
  for v in ${VARIANTS:-zero3 zero3_dc}; do
    base=full_zero3_compiled flags=()
    [[ $v != offload* ]] || base=full_zero3_offload_15gb
    [[ $v != *_dc ]] || flags+=(--deepcompile true)
    timeout "${LIMIT:-240}" python3 -m dsnb run $(bench_flags $base 8 16) "${flags[@]}" \
      --tracking_uri "$DB" --experiment dsnb_deepcompile --run_name "$v" > "$OUT/$v.log" 2>&1
    echo "$v exit $?"; dump deepcompile > /dev/null
  done
  dump deepcompile
  ;;
rows)  # the throughput mode's rows from a cold compile cache each: 24 rows of 512 tokens on the default passage prompt
  # (the throughput stage's before 2026-12-02), 12 of 1024 (the stage's now) and 6 of 2048 (the same tokens a step, rows fuller: fewer tails left empty),
  # and 24 of 512 on the closed-book eos prompt, whose shorter samples the 50% MFU was first measured on
  prebuild synthetic:llama-3.2-3b
  for v in ${VARIANTS:-rows512 rows1024 rows2048 eos512}; do
    case $v in rows*) len=${v#rows} prompt=passage ;; eos*) len=${v#eos} prompt=eos ;;
      *) echo "$v: not a rows variant (rowsLENGTH on the passage prompt, eosLENGTH on the closed-book one)"; continue ;; esac
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cold_$v timeout "${LIMIT:-170}" python3 -m dsnb run \
      $(bench_flags throughput_compiled 8 12) --max_length "$len" --batch_size $((24 * 512 / len)) --prompt "$prompt" \
      --tracking_uri "$DB" --experiment dsnb_rows --run_name "$v" > "$OUT/$v.log" 2>&1
    echo "$v exit $?: $(grep -E '^dsnb: [0-9]+ samples|s a step after|^  speed' "$OUT/$v.log" | tr '\n' ' ')"
  done
  dump rows
  ;;
t4drop)  # the colab_t4 preset's fast recipe compiled in fp16 on the default (passage) prompt, LoRA's dropout masks
  # drawn by inductor (as before dsnb/dropout.py) and then by dsnb's kernel, one after the other in one call
  prebuild synthetic:llama-3.2-3b
  timeout 150 python3 -m dsnb run "${T4_FAST[@]}" --torch_compile true --dropout_kernel false --run_name t4_inddrop \
    > "$OUT/t4_inddrop.log" 2>&1
  timeout 150 python3 -m dsnb run "${T4_FAST[@]}" --torch_compile true --run_name t4_keepmask > "$OUT/t4_keepmask.log" 2>&1
  dump t4drop
  ;;
t4pad)  # why 8-bit weights padded per batch took longer a step than padded to 512 (notebook01.jsonl 1.40 s against
  # colab.jsonl 0.93 s): the colab_t4 preset's 8-bit recipe (fp16, 2 x 4) on the passage prompt, the same samples and
  # steps padded to max_length, to each batch's longest sample and to a multiple of 64, then longest as one micro-batch
  # of 8; then bitsandbytes' 8-bit matmul alone (one 3B layer, forward and backward) at each padding's shapes, each in
  # a fresh process, with fp16 weights beside it, and again with 6 outlier columns (LLM.int8's mixed decomposition)
  prebuild synthetic:llama-3.2-3b
  PAD=("${B3[@]}" --preset colab_t4 --max_steps 12 --untimed_steps 3 --logging_steps 1 --eval_samples 0
       --experiment t4pad)
  for v in max_length longest bucket longest_b8; do
    flags=(--padding "${v%_b8}")
    [[ $v != *_b8 ]] || flags+=(--batch_size 8 --grad_accum 1)
    timeout 70 python3 -m dsnb run "${PAD[@]}" "${flags[@]}" --run_name "pad_$v" > "$OUT/pad_$v.log" 2>&1
    echo "$v exit $?: $(grep -E 's a step after|^  speed' "$OUT/pad_$v.log" | tr '\n' ' ')"
  done
  timeout 80 python3 benchmarks/bnb_shapes.py --out "$OUT/bnb_shapes.jsonl" 2>&1 | grep -v "^Failed to load"
  timeout 40 python3 benchmarks/bnb_shapes.py --weights 8bit --outliers 6 --out "$OUT/bnb_shapes.jsonl" 2>&1 \
    | grep -v "^Failed to load"
  dump t4pad
  ;;
*)
  echo "usage: OUT=dir bash benchmarks/gpu_runs.sh bench|advise|throughput|fp8|fp8quality|fp8head|fp8gemms|chunkloss|matmuls|peers|multi|capacity|zero3|big|nvme|colab|speed|last|profile|fast|zero2knobs|scale8b|notebook01|notebook01rerun|zerographs|graphscheck|deepcompile|scale4|rows|t4drop|t4pad [more]" >&2
  exit 2
  ;;
esac
done
