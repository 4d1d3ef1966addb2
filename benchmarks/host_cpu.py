"""dsnb's host-RAM estimate on the CPU against what each run's process held (its peak resident memory), one
`dsnb run --offline` process a config (runs on the CPU, about 10 minutes on 2 cores, 9 GB of RAM at most):

    python benchmarks/host_cpu.py > benchmarks/results/host_cpu.md

On the CPU the estimate is the process without CUDA (estimate.CPU_PROCESS_MB) plus everything a GPU would hold
(weights, gradients, optimizer, activations; a buffer allocated whole counts only where it is written). The plan
prints the figures below beside its estimate (estimate.CPU_HOST_ERROR; tests/test_estimate.py holds the two alike).
"""
import os
import statistics
import subprocess
import sys
import tempfile

import mlflow

TINY = ["--max_steps", "3", "--eval_samples", "0"]
B1 = ["--model", "synthetic:llama-3.2-1b", "--max_steps", "2", "--batch_size", "1", "--grad_accum", "1",
      "--num_samples", "8", "--eval_samples", "0"]
RUNS = [  # name, flags after `dsnb run --offline`
    ("tiny LoRA 8-bit (the offline default)", TINY),
    ("tiny LoRA, weights fp32", TINY + ["--quantization", "none"]),
    ("tiny full, ZeRO-2 + optimizer offload", TINY + ["--quantization", "none", "--lora_r", "0", "--strategy",
                                                      "zero2", "--offload_optimizer", "cpu"]),
    ("tiny full, ZeRO-3 + optimizer and parameter offload", TINY + [
        "--quantization", "none", "--lora_r", "0", "--strategy", "zero3", "--offload_optimizer", "cpu",
        "--offload_param", "cpu"]),
    ("quality preset (synthetic:small, full)", ["--preset", "quality", "--max_steps", "20"]),
    ("1B LoRA, weights fp32", B1 + ["--quantization", "none"]),
    ("1B LoRA 8-bit", B1 + ["--quantization", "8bit"]),
    ("1B LoRA, ZeRO-3 + parameter offload", B1 + ["--quantization", "none", "--strategy", "zero3",
                                                  "--offload_param", "cpu", "--offload_optimizer", "cpu"]),
]


def main() -> None:
    rows, errors = [], []
    with tempfile.TemporaryDirectory() as folder:
        uri = f"sqlite:///{folder}/mlflow.db"
        for i, (name, flags) in enumerate(RUNS):
            print(f"{name} ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "dsnb", "run", "--offline", *flags, "--run_name", f"host{i}",
                            "--tracking_uri", uri, "--output_dir", f"{folder}/runs", "--save_model", "false"],
                           cwd=folder, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            [run] = mlflow.MlflowClient(uri).search_runs(
                [e.experiment_id for e in mlflow.MlflowClient(uri).search_experiments()],
                f"attributes.run_name = 'host{i}'")
            m = run.data.metrics
            error = m["est_peak_host_mb"] / m["peak_cpu_rss_mb"] - 1
            errors.append(abs(error))
            rows.append(f"| {name} | {m['est_peak_host_mb']:,.0f} | {m['peak_cpu_rss_mb']:,.0f} | {error:+.1%} |")
    print("# " + __doc__.split("\n\n")[0].replace("\n", " ").rstrip(":") + "\n\n    python benchmarks/host_cpu.py > "
          "benchmarks/results/host_cpu.md\n")
    print(f"On {os.cpu_count()} cores; each row one `python -m dsnb run --offline` process.\n")
    print("| run | estimated MB | measured peak RSS MB | error |\n|---|---:|---:|---:|")
    print("\n".join(rows))
    print(f"\nHost RAM on the CPU, {len(errors)} runs: median absolute error {statistics.median(errors):.1%}, largest "
          f"{max(errors):.1%}.")


if __name__ == "__main__":
    main()
