"""The peers' LoRA fine-tuning of the bench's task, each run the way its docs run it, beside dsnb's (issue 38).

    python benchmarks/peers.py data --out DATA.json                   # the samples every peer trains (dsnb tokenizes)
    python benchmarks/peers.py run PEER --data DATA.json --out R.jsonl [--batch 8] [--packed] [--steps 30]
    python benchmarks/peers.py table R.jsonl [dsnb's runs as dump_runs.py lists them]

The task is the bench's: the synthetic 3B Llama shape (random weights: speed and memory are real, the loss is not),
the synthetic SQuAD set on dsnb's passage prompt, the tutorial's LoRA (r 16, alpha 16, on q_proj and v_proj), bf16,
the loss over the whole sample. Every peer trains the same token ids (tokenized once by dsnb, `data`), from the same
seed, for the same untimed and timed steps, each in its own process (gpu_runs.sh peers). Peers:

  hf_compile  transformers' Trainer with torch_compile=True, batches padded to their longest sample (the HF docs' way)
  trl_liger   TRL's SFTTrainer with use_liger_kernel=True: Liger's fused RMSNorm, rotary and SwiGLU, and TRL's own
              chunked LM head and loss (TRL 1.15 turns Liger's fused linear cross-entropy off for it; its newer
              "use_kernels" fetches kernels from the hub, which the GPU machine cannot reach); --packed: TRL's packing
              (best-fit rows of --max_length tokens, padding-free, through SDPA, flash-attention not being installed:
              transformers masks each row's samples apart but attends over the whole flattened batch)
  unsloth     Unsloth's FastLanguageModel and its SFTTrainer, LoRA dropout 0 (its fast LoRA path needs it: the others
              keep the tutorial's 0.05), its batches padding-free by default (attention per sample); --packed as TRL
Gradient checkpointing is off for every peer (TRL's and Unsloth's defaults turn it on to save memory; the 3B LoRA fits
the GPU without it, and dsnb does not recompute either), and every peer steps the same AdamW (training_args), so the
table compares speed at equal work; its "samples a batch as" column says how each laid out its batches.

Timing: the timed steps' wall time between a synchronize before the first timed step and one after the last (a
TrainerCallback), and each timed step's, synchronized at its end (its median and slowest: a step that compiles or
tunes kernels for a new batch shape shows as the slowest); samples and real (non-padding) tokens counted from the
batches the collator built for exactly those steps; MFU by dsnb's convention (dsnb/metrics.py: 4 N + 6 N_trainable
model FLOPs a real token over the datasheet peak). Peak GPU memory from torch's allocator over the whole process. A
peer that fails is recorded with its error.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))
LORA = dict(r=16, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"])
PEERS = ("hf_compile", "trl_liger", "unsloth")


def make_data(out: str, model: str, num_samples: int, max_length: int) -> None:
    """The bench's samples as dsnb trains them (the passage prompt, its windows, the end-of-sequence token), and a
    folder OUT.model holding the model's files (linked) with dsnb's tokenizer beside them, as the peers load one."""
    from dsnb.config import RunConfig
    from dsnb.data import build_dataset
    from dsnb.model import load_tokenizer, resolve_model

    cfg = RunConfig.layered({"model": model, "dataset": "synthetic", "num_samples": num_samples,
                             "max_length": max_length, "padding": "longest"}, offline=True)
    source, folder = resolve_model(cfg.model), os.path.abspath(out + ".model")
    tokenizer = load_tokenizer(cfg)
    os.makedirs(folder, exist_ok=True)
    tokenizer.save_pretrained(folder)  # first: a link to a tokenizer file of the model would write into dsnb's cache
    for name in os.listdir(source):
        if not os.path.exists(os.path.join(folder, name)):
            os.symlink(os.path.join(source, name), os.path.join(folder, name))
    ids = list(build_dataset(cfg, tokenizer)["input_ids"])
    with open(out, "w") as f:
        json.dump({"model": folder, "input_ids": ids}, f)
    lengths = [len(x) for x in ids]
    print(f"{len(ids)} samples, {sum(lengths) / len(ids):.1f} tokens a sample, longest {max(lengths)} -> {out}")


class Counter:
    """Wraps a collator: the samples and real tokens of each batch, in the order the batches were built."""

    def __init__(self, collate):
        self.collate, self.batches = collate, []

    def __call__(self, features):
        batch = self.collate(features)
        ids = batch["input_ids"]
        if "attention_mask" in batch:
            tokens, samples = int(batch["attention_mask"].sum()), ids.shape[0]
        else:  # padding-free: one row of samples end to end, each starting at position 0
            tokens, samples = ids.numel(), int((batch["position_ids"] == 0).sum())
        self.batches.append((samples, tokens))
        return batch


def device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def callback(untimed: int, timed: int, clock: dict):
    from transformers import TrainerCallback

    from dsnb.metrics import sync

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == untimed:
                sync(device())
                clock["start"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if untimed < state.global_step <= untimed + timed:  # each timed step synced, as its loss's logging
                sync(device())                                  # would right after: no step's work lands in the next
                clock.setdefault("ends", []).append(time.perf_counter())
                clock["end"] = clock["ends"][-1]

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                clock["loss"] = logs["loss"]

    return Clock()


def training_args(a, cls, **extra):
    """The same optimizer and schedule for every peer (Unsloth's own defaults differ: 8-bit AdamW, weight decay,
    warm-up): AdamW in fp32 states, fused on the GPU, no weight decay or warm-up."""
    return cls(output_dir=f"/tmp/peers_{a.peer}", max_steps=a.untimed + a.steps, per_device_train_batch_size=a.batch,
               gradient_accumulation_steps=1, learning_rate=2e-4, bf16=True, logging_steps=1, save_strategy="no",
               report_to="none", seed=42, dataloader_num_workers=0, use_cpu=device() == "cpu",
               optim="adamw_torch_fused" if device() == "cuda" else "adamw_torch", weight_decay=0.0, warmup_steps=0,
               **extra)


def sft_args(a, **extra):
    from trl import SFTConfig
    packing = dict(packing=True, packing_strategy="bfd", max_length=a.max_length) if a.packed else \
        dict(max_length=a.max_length)
    return training_args(a, SFTConfig, gradient_checkpointing=False, **packing, **extra)


def hf_compile(a, data, dataset):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(data["model"], dtype=torch.bfloat16, attn_implementation="sdpa")
    model = get_peft_model(model.to(device()), LoraConfig(task_type="CAUSAL_LM", **LORA))
    tokenizer = AutoTokenizer.from_pretrained(data["model"])
    dataset = dataset.map(lambda row: {"labels": row["input_ids"]})
    collate = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)
    args = training_args(a, TrainingArguments, torch_compile=True)
    return model, Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate)


def trl_liger(a, data, dataset):
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    model = AutoModelForCausalLM.from_pretrained(data["model"], dtype=torch.bfloat16, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(data["model"])
    trainer = SFTTrainer(model=model.to(device()), args=sft_args(a, use_liger_kernel=True), train_dataset=dataset,
                         processing_class=tokenizer, peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA))
    return trainer.model, trainer


def unsloth(a, data, dataset):
    from unsloth import FastLanguageModel  # before transformers, trl and peft, as Unsloth asks
    import torch
    from trl import SFTTrainer

    model, tokenizer = FastLanguageModel.from_pretrained(data["model"], max_seq_length=a.max_length,
                                                         dtype=torch.bfloat16, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, **{**LORA, "lora_dropout": 0.0}, bias="none",
                                             use_gradient_checkpointing=False, random_state=42)
    trainer = SFTTrainer(model=model, args=sft_args(a), train_dataset=dataset, processing_class=tokenizer)
    return model, trainer


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    names = ("torch", "transformers", "peft", "trl", "liger-kernel", "unsloth", "unsloth_zoo", "datasets", "triton")
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def measure(a, record: dict) -> None:
    import datasets
    import torch

    from dsnb.metrics import GPU_PEAK_FLOPS, flops_per_token

    if a.peer == "unsloth":
        import unsloth  # noqa: F401  first, as Unsloth asks
    with open(a.data) as f:
        data = json.load(f)
    torch.manual_seed(42)
    dataset = datasets.Dataset.from_dict({"input_ids": data["input_ids"]})
    model, trainer = globals()[a.peer](a, data, dataset)
    counter = Counter(trainer.data_collator)
    trainer.data_collator = counter
    clock: dict = {}
    trainer.add_callback(callback(a.untimed, a.steps, clock))
    trainer.train()
    layout = (f"packed rows of {a.max_length}" if a.packed else
              "padding-free" if getattr(trainer.args, "padding_free", False) else "padded per batch")
    seconds = clock["end"] - clock["start"]
    steps = [1000 * (b - a) for a, b in zip([clock["start"]] + clock["ends"][:-1], clock["ends"], strict=True)]
    samples, tokens = (sum(x) for x in zip(*counter.batches[a.untimed:a.untimed + a.steps], strict=True))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    per_token = flops_per_token(model.config, trainable, full=False)
    gpu = torch.cuda.is_available()
    name = torch.cuda.get_device_name() if gpu else "cpu"
    peak = next((v for k, v in GPU_PEAK_FLOPS.items() if k in name), None)
    memory = lambda f: f() / 2**20 if gpu else None  # noqa: E731
    record.update(status="FINISHED", layout=layout, batches=counter.batches, seconds=seconds, samples=samples,
                  real_tokens=tokens,
                  samples_per_second=samples / seconds, tokens_per_second=tokens / seconds,
                  mfu=tokens / seconds * per_token / peak if peak else None, trainable_params=trainable,
                  step_ms=steps, median_step_ms=statistics.median(steps), slowest_step_ms=max(steps),
                  flops_per_token=per_token, gpu=name, last_loss=clock.get("loss"),
                  peak_gpu_allocated_mb=memory(torch.cuda.max_memory_allocated),
                  peak_gpu_reserved_mb=memory(torch.cuda.max_memory_reserved))


def write(record: dict, out: str) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def run(a) -> int:
    record = {"peer": a.peer, "batch": a.batch, "packed": a.packed, "max_length": a.max_length,
              "untimed_steps": a.untimed, "timed_steps": a.steps, "versions": versions()}

    def stopped(signum, frame):
        """`timeout` in gpu_runs.sh: the peer recorded FAILED and gone at once (an exception raised here could be
        caught and passed over by the library it lands in: the stopped test saw compiling go on)."""
        record.update(status="FAILED", error="stopped by the call's time limit (SIGTERM)")
        write(record, a.out)
        os._exit(1)

    signal.signal(signal.SIGTERM, stopped)
    try:
        measure(a, record)
    except Exception as error:  # a peer that fails is a result too: recorded with what it said
        traceback.print_exc()
        record.update(status="FAILED", error=f"{type(error).__name__}: {str(error)[:400]}")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    write(record, a.out)
    return 0 if record["status"] == "FINISHED" else 1


def dsnb_rows(path: str) -> list[dict]:
    """dsnb's own runs in the same call (dump_runs.py's listing) as rows of the same table."""
    rows = []
    for line in open(path):
        r = json.loads(line)
        if not r["name"].startswith("dsnb_"):  # another stage's run in the machine's store
            continue
        m, packed = r["metrics"], "throughput" in r["name"]  # the stage's: dsnb_fast_compiled_b8, dsnb_throughput_cold
        rows.append({"peer": r["name"], "batch": 12 if packed else 8, "status": r["status"], "error": r.get("failure"),
                     "layout": "filled rows of 1024" if packed else "padded to a multiple of 64",
                     "samples_per_second": m.get("samples_per_second"), "tokens_per_second": m.get("tokens_per_second"),
                     "mfu": m.get("mfu"), "peak_gpu_allocated_mb": m.get("peak_gpu_allocated_mb"),
                     "mean_step_ms": m.get("step_time_ms")})
    return rows


def table(paths: list[str]) -> str:
    rows = [json.loads(line) for line in open(paths[0])] if os.path.exists(paths[0]) else []
    for path in paths[1:]:
        rows += dsnb_rows(path) if os.path.exists(path) else []
    out = ["| run | batch | samples a batch as | samples/s | real tokens/s | MFU | mean step ms | median step ms "
           "| slowest step ms | peak allocated MB | status |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    num = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    for r in rows:
        status = r["status"] + (f": {r['error'][:160]}" if r.get("error") else "")
        layout = r.get("layout") or ("packed" if r.get("packed") else "-")
        mean = r.get("mean_step_ms") or (1000 * r["seconds"] / r["timed_steps"] if r.get("seconds") else None)
        out.append(f"| {r['peer']} | {r['batch']} | {layout} "
                   f"| {num(r.get('samples_per_second'), ',.1f')} | {num(r.get('tokens_per_second'), ',.0f')} "
                   f"| {num(r.get('mfu'), '.2%')} | {num(mean, ',.0f')} | {num(r.get('median_step_ms'), ',.0f')} "
                   f"| {num(r.get('slowest_step_ms'), ',.0f')} | {num(r.get('peak_gpu_allocated_mb'), ',.0f')} "
                   f"| {status} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("data")
    d.add_argument("--out", required=True)
    d.add_argument("--model", default="synthetic:llama-3.2-3b")
    d.add_argument("--num_samples", type=int, default=6000)
    d.add_argument("--max_length", type=int, default=512)
    r = sub.add_parser("run")
    r.add_argument("peer", choices=PEERS)
    r.add_argument("--data", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--batch", type=int, default=8)
    r.add_argument("--packed", action="store_true")
    r.add_argument("--max_length", type=int, default=1024)
    r.add_argument("--untimed", type=int, default=10)
    r.add_argument("--steps", type=int, default=30)
    t = sub.add_parser("table")
    t.add_argument("paths", nargs="+")
    a = parser.parse_args()
    if a.command == "data":
        make_data(a.out, a.model, a.num_samples, a.max_length)
        return 0
    if a.command == "table":
        print(table(a.paths))
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
