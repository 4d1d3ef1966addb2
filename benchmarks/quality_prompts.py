"""What the quality scores say under each prompt, offline: the quality preset (synthetic:small trained in full on the
synthetic set) with the passage prompt (dsnb's default: reading comprehension) and with the tutorial's closed-book
text, side by side: exact match and F1 before and after training, on the held-out questions and, closed-book, on the
trained ones asked again (recall). Each run in its own process, on the CPU.

    python benchmarks/quality_prompts.py > benchmarks/results/quality_prompts_cpu.md
"""
import os
import tempfile

from dsnb.config import RunConfig
from dsnb.launch import run_all

HEADER = """# The quality preset under each prompt (CPU, synthetic:small)

    python benchmarks/quality_prompts.py > benchmarks/results/quality_prompts_cpu.md

The quality preset (`python -m dsnb run --preset quality`: synthetic:small, 0.4M parameters, trained in full for 150
steps on 1,024 synthetic rows, 72 held-out questions) with the passage prompt (dsnb's default) and the tutorial's
closed-book text (`--prompt eos`). The synthetic held-out questions are paraphrases of facts that training rows hold,
so closed-book they measure recall of trained facts, not prior knowledge as SQuAD's would; the recall rows ask 72
trained questions again, word for word. Training seconds are this machine's (2 CPU cores, shared with other work
when this was made): a rough figure.
"""


def main():
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{os.path.join(tmp, 'mlflow.db')}"
        cfgs = [RunConfig.layered({"preset": "quality", "prompt": prompt, "run_name": f"quality_{prompt}",
                                   "tracking_uri": uri, "output_dir": os.path.join(tmp, "runs"), "save_model": False})
                for prompt in ("passage", "eos")]
        results = run_all(cfgs, progress=False)
    print(HEADER)
    print("| prompt | questions | exact match before | after | F1 before | after | training s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for cfg, r in zip(cfgs, results, strict=True):
        m = r.metrics
        for name, label in (("eval", "held-out"), ("recall", "trained, asked again (recall)")):
            if f"{name}_exact_match" in m:
                print(f"| {cfg.prompt} | {label}: {m[f'{name}_questions']:.0f} | "
                      f"{m[f'{name}_exact_match_before']:.2f} | {m[f'{name}_exact_match']:.2f} | "
                      f"{m[f'{name}_f1_before']:.2f} | {m[f'{name}_f1']:.2f} | {m['train_runtime']:.0f} |")
    print(f"\nStatus: {', '.join(f'{r.name} {r.status}' for r in results)}.")


if __name__ == "__main__":
    main()
