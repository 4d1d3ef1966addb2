"""The command line: every run-config field is a --<field> flag.

    python -m dsnb run --offline --strategy zero3 --offload_param cpu    # one variant, one MLflow run
    python -m dsnb check --preset colab_t4                               # the same checks and estimates, no training
    python -m dsnb compare --offline                                     # the tutorial's pair, then a table
    python -m dsnb sweep -f variants/sweep_zero_stages.yaml --offline    # papermill, one kernel per variant
    python -m dsnb capacity -f variants/capacity_map.yaml --gpus 2       # model x variant x budget map
    python -m dsnb advise --gpu T4 --ram 12.7                            # every variant ranked, before any GPU
    python -m dsnb export -o dsnb_mlflow.zip                             # the store in one zip
    python -m dsnb ui                                                    # how to open MLflow's UI locally

Exit codes: 0 success; 1 a run failed (recorded as a FAILED MLflow run); 2 invalid configuration (one line,
no traceback); 130 interrupted (the running variant is stopped and recorded KILLED).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import typing

from . import preflight, tracking
from .bench import BASELINE_NUMBERS, BENCH_FILE, bench_variants, markdown, regressions, run_bench
from .capacity import md_table, run_capacity
from .compare import compare
from .config import (OFFLINE, OFFLINE_ENV, RENAMED, ConfigError, RunConfig, check_names, describe, field_docs,
                     field_names, offline_requested, read_json_file, read_variant, redact, stay_off_the_hub)
from .launch import _interrupted, run_variant, watch_parent
from .preflight import check_output_folder, prepare
from .publish import check_push, push_to_hub, save_model
from .report import compare_table, format_table, run_summary, same_work, verdict
from .sweep import run_sweep
from .tracking import STOPPED, RunResult, existing_store, export_store, is_server, ui_command


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and no abbreviated flags (--learning_rat is refused, not expanded)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        named = command_named()
        at = self.prog if not named or self.prog.endswith(f" {named}") else f"{self.prog} {named}"
        raise ConfigError(f"{message}{close_flags(message, named)} ({at} --help lists what it takes)")


ARGV: list[str] = []  # the command line main() parses


def command_named() -> str:
    """The subcommand of this command line, for the help to point at (run, in python -m dsnb run --help)."""
    return next((a for a in ARGV[:1] if a in COMMANDS), "")


def close_flags(message: str, command: str) -> str:
    """For flags argparse did not recognize, the command's own flags spelled nearly so (--batchsize: --batch_size)."""
    import difflib

    if not message.startswith("unrecognized arguments:"):
        return ""
    subparsers = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    own = subparsers.choices.get(command)
    flags = [o[2:] for o in (own._option_string_actions if own else ()) if o.startswith("--")]
    given = [a.split("=")[0][2:] for a in message.split(":", 1)[1].split() if a.startswith("--")]
    close = {g: difflib.get_close_matches(g.replace("-", "_"), flags, n=1, cutoff=0.75) for g in given}
    said = [f"--{flag}: did you mean --{match[0]}?" for flag, match in close.items() if match and match[0] != flag]
    return f"; {'; '.join(said)}" if said else ""


class Last(argparse.Action):
    """A flag of the run's config (its fields, -f, --variant). Given twice with two values, the last counts, as in
    argparse, and dsnb says so on stdout (stderr holds an error alone): a command line built from pieces (a script's
    base flags, then one changed) overrides that way. Said redacted: a tracking_uri may carry a password."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, self.default)
        if before is not self.default and not same_value(before, values, self.dest in NUMBERS):
            print(redact(f"dsnb: note: {option_string} given twice ({before}, then {values}); the last counts: "
                         f"{option_string} {values}"))  # stdout, as dsnb's other notes: stderr holds errors alone
        setattr(namespace, self.dest, values)


def same_value(a: str, b: str, number: bool) -> bool:
    """Two spellings of one flag's value: the same text, or for a number field the same number (1e-4 and 0.0001)."""
    try:
        return a == b or (number and float(a) == float(b))
    except ValueError:
        return False


NUMBERS = {name for name, kind in typing.get_type_hints(RunConfig).items() if kind in (int, float, int | None,
                                                                                      float | None)}


def config_parser() -> argparse.ArgumentParser:
    """Flags shared by every command that builds a RunConfig."""
    parser = Parser(add_help=False)
    group = parser.add_argument_group("run config (defaults: the tutorial's values)")
    group.add_argument("-f", "--file", action=Last, help="YAML file of run-config fields; flags override it")
    group.add_argument("--offline", action="store_true",
                       help=f"the offline default {OFFLINE} (also {OFFLINE_ENV}=1)")
    docs = field_docs()
    defaults = RunConfig().to_dict()
    for name in field_names():  # a % in a field's text doubled: argparse reads % as a format
        group.add_argument(f"--{name}", default=argparse.SUPPRESS, metavar="V", action=Last,
                           help=f"{docs.get(name, '')} (default {defaults[name]!r})".replace("%", "%%"))
    for old in RENAMED:  # refused with the new name, not as an unknown flag
        group.add_argument(f"--{old}", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def build_config(args: argparse.Namespace) -> RunConfig:
    """Defaults < offline default < YAML file (one variant of it, where it names several: --variant) < flags
    (RunConfig.layered)."""
    flags = {k: v for k, v in vars(args).items() if k in field_names() or k in RENAMED}
    if args.variant and not args.file:
        raise ConfigError(f"--variant {args.variant} names a variant of a file: give the file with -f")
    fields = read_variant(args.file, args.variant) if args.file else {}
    try:
        return RunConfig.layered(fields, flags, offline=args.offline or offline_requested())
    except ConfigError as e:  # a value the file gave (not a flag over it): the file (and variant) named
        field = str(e).split(" ", 1)[0]
        if field in fields and field not in flags:
            raise ConfigError(f"{args.file}{f' (variant {args.variant})' if args.variant else ''}: {e}") from None
        raise


def variant_parser() -> argparse.ArgumentParser:
    """--variant, for the commands that run one variant of a file (run, check, compare)."""
    parser = Parser(add_help=False)
    parser.add_argument("--variant", default="", action=Last,
                        help="the variant to run where -f names a file of several (dsnb/bench.yaml)")
    return parser


def flag_overrides(args: argparse.Namespace) -> dict:
    """The run-config fields given as flags (for commands whose file holds several variants)."""
    flags = {k: v for k, v in vars(args).items() if k in field_names() or k in RENAMED}
    check_names(flags)
    return flags


def parser() -> argparse.ArgumentParser:
    common = config_parser()
    top = Parser(prog="python -m dsnb", description="What DeepSpeed buys you, measured.")
    # DeepSpeed's launcher passes --local_rank=N before the command (it also sets LOCAL_RANK, which dsnb reads).
    top.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)
    sub = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    one = variant_parser()
    run = sub.add_parser("run", parents=[common, one], help="run one variant as one MLflow run")
    run.add_argument("--resume", action="store_true", help="continue the newest failed or killed run of this "
                     "name from its last checkpoint (needs checkpoint_steps), into the same MLflow run")
    run.add_argument("--verbose", action="store_true", help="print every metric at the end, not only the summary")
    sub.add_parser("check", parents=[common, one], help="check a variant without training: its fields, this machine, "
                   "its data (read and validated), and its GPU and host-RAM estimates")
    pair = sub.add_parser("compare", parents=[common, one], help="run the tutorial's pair and print the table (a "
                          "comparison of this config that finished is shown, not trained again)")
    pair.add_argument("--again", action="store_true", help="measure it afresh as a new comparison, even where one of "
                      "this config finished")
    sub.add_parser("sweep", parents=[common], help="execute a notebook per variant of a sweep file (-f); "
                   "field flags override every variant")
    bench = sub.add_parser("bench", help="the tutorial's recipe vs dsnb's fast recipe, repeated; writes "
                           "<gpu>.json and .md into --out (never over an earlier result)")
    bench.add_argument("--offline", action="store_true", help="synthetic:tiny on the CPU instead of the 3B shape")
    bench.add_argument("--repeats", type=count(1), default=3)
    bench.add_argument("--untimed", type=count(0), default=3, help="untimed optimizer steps first")
    bench.add_argument("--gpus", type=count(1), default=1, help="variants run side by side, one per GPU")
    bench.add_argument("--steps", type=count(1), default=10, help="timed optimizer steps")
    bench.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    bench.add_argument("-f", "--file", default=None, help="the bench's variants file (default: dsnb/bench.yaml "
                       "of dsnb's repository)")
    bench.add_argument("--out", default="bench_results", help="folder for <gpu>.json and .md (never overwritten)")
    bench.add_argument("--baseline", default="", help="a committed bench JSON: exit 1 where this run regressed "
                       "from it (speed-up to the tutorial's recipe halved, failed runs, a slow tutorial pair)")
    bench.add_argument("--tracking_uri", default=RunConfig.tracking_uri)
    capacity = sub.add_parser("capacity", parents=[common], help="model x variant x memory budget: which fit, "
                              "how fast; a table, a PNG and the fastest fitting variant per budget")
    capacity.add_argument("--gpus", type=count(1), default=1, help="runs side by side, one per GPU")
    capacity.add_argument("--out", default="capacity_map", help="folder for capacity.md/.csv/.png (not overwritten)")
    capacity.add_argument("--only", default="", help="comma-separated variant names and/or models to run "
                          "(default: every cell)")
    advise = sub.add_parser("advise", parents=[common, one], help="rank every variant worth trying for this "
                            "model, task and machine by predicted time, with predicted GPU and host-RAM peaks and "
                            "whether each fits; no GPU needed (--verify K runs the top K on this machine's GPU)")
    advise.add_argument("--gpu", default="", help="the GPU to advise for: T4, L4, A100, H100 or H200 (default: this "
                        "machine's)")
    advise.add_argument("--gpus", type=count(0), default=0, help="how many of them (default: num_gpus where it is "
                        "above 1, else this machine's, else 1)")
    advise.add_argument("--ram", type=float, default=0.0, help="the host's RAM in GB (default: this machine's where "
                        "it is the one advised for, else ram_budget_gb, else not judged)")
    advise.add_argument("--verify", type=count(0), default=0, help="run the top K variants that fit for a few steps "
                        "each, here, and show measured beside predicted (needs this machine's GPU)")
    advise.add_argument("--top", type=count(1), default=20, help="rows shown (default 20)")
    save = sub.add_parser("save", help="write a run's trained adapter (or model) to a folder; --merge folds the "
                          "LoRA weights into the base model; --push_to uploads it (needs a token)")
    save.add_argument("--run_id", required=True, help="the MLflow run id (python -m dsnb ui shows them)")
    save.add_argument("-o", "--output", required=True, help="a new folder")
    save.add_argument("--merge", action="store_true", help="save the base model with the adapter merged in")
    save.add_argument("--push_to", default="", help="a hub repository, owner/name (created private if new)")
    save.add_argument("--token", default="", help="hub token for --push_to (default: $HF_TOKEN); never logged")
    save.add_argument("--tracking_uri", default=RunConfig.tracking_uri)
    sub.add_parser("prepare", help="once after installing (colab_setup.sh runs it): report the GPU, build "
                   "DeepSpeed's CPU Adam")
    export = sub.add_parser("export", help="zip the MLflow store for download")
    export.add_argument("-o", "--output", default="dsnb_mlflow.zip")
    ui = sub.add_parser("ui", help="print the command that opens the MLflow UI on 127.0.0.1")
    for command in (export, ui):  # the store a run wrote: its tracking_uri, or the results_folder holding it
        where = command.add_mutually_exclusive_group()
        where.add_argument("--tracking_uri", default=None, help=f"the store (default {RunConfig.tracking_uri})")
        where.add_argument("--results_folder", default=None, help="the results_folder whose mlflow.db to open")
    return top


def store_of(args) -> str:
    """The store export and ui open: --tracking_uri, or the one a run with --results_folder writes."""
    if args.results_folder:
        return RunConfig.layered({"results_folder": args.results_folder}).tracking_uri
    return args.tracking_uri or RunConfig.tracking_uri


def count(low: int):
    """An argparse type: an integer of at least `low` (2.5, nan or -1 are refused, not rounded)."""
    def parse(text: str) -> int:
        value = text.strip()
        if not value.lstrip("+-").isdigit() or int(value) < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least {low}")
        return int(value)

    parse.__name__ = f"whole number >= {low}"
    return parse


def negative_values(argv: list[str]) -> list[str]:
    """`--learning_rate -1e-4` as `--learning_rate=-1e-4`: argparse would take a negative number for a flag."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and arg.startswith("-") and _number(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _terminated(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command line (not a test calling in): SIGTERM ends like Ctrl-C, the variant recorded KILLED
        signal.signal(signal.SIGTERM, _terminated)
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # a script's background job (`dsnb compare &`) starts
            signal.signal(signal.SIGINT, signal.default_int_handler)  # so: kill -INT still stops it, as Ctrl-C does
    argv = negative_values(sys.argv[1:] if argv is None else argv)
    ARGV[:] = argv
    try:
        args = parser().parse_args(argv)
        if getattr(args, "offline", False):
            stay_off_the_hub()
        with tracking.interrupts_after_writes():  # Ctrl-C or SIGTERM mid-write would leave the store locked
            return COMMANDS[args.command](args)
    except ConfigError as e:
        print(f"dsnb: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:

        if STOPPED:
            print(f"dsnb: interrupted; the running variant was stopped and its run {', '.join(STOPPED)} recorded "
                  "KILLED, with what it had measured by then", file=sys.stderr)
        else:
            print("dsnb: interrupted before any variant started training; no run was recorded", file=sys.stderr)
        return 130


def cmd_run(args) -> int:
    cfg = build_config(args)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    preflight.pin_one_gpu(cfg)
    if cfg.num_gpus > 1 and "WORLD_SIZE" not in os.environ:  # not under a launcher yet: start one
        if args.resume:
            raise ConfigError("--resume runs in one process; start it under deepspeed or torchrun yourself")
        result = run_variant(cfg)
        if result.status == "FINISHED":  # the summary a one-process run prints, from what its ranks recorded
            print_summary(result.metrics, cfg, result.run_id, args.verbose)
        return 0 if result.status == "FINISHED" else 1
    preflight.check(cfg)
    if "WORLD_SIZE" in os.environ:  # a rank under a launcher: its agent gone (with its node), the rank stops too

        signal.signal(signal.SIGINT, _interrupted)  # a launcher may start its ranks with SIGINT ignored
        watch_parent(os.getppid())
    with tracking.interrupts_after_writes():  # a rank's SIGINT handler is set above, after main's
        if args.resume:
            run_id, checkpoint = tracking.resumable_run(cfg)
        else:  # opened here, so a failure can be told as the store holds it
            run_id, checkpoint = (tracking.create_run(cfg) if preflight.is_rank0() else None), None
        from .train import train  # deferred: transformers and torch load only for a run (not for --help, ui, export)

        try:
            metrics = train(cfg, run_id, checkpoint)
        except (ConfigError, KeyboardInterrupt):
            raise
        except Exception:
            import traceback

            print(redact(traceback.format_exc()), end="", file=sys.stderr)  # a library's error may quote the URI
            print(redact(f"dsnb: the run failed; {tracking.what_was_recorded(cfg.tracking_uri, run_id)}"),
                  file=sys.stderr)
            return 1
    if preflight.is_rank0():
        print_summary(metrics, cfg, run_id, args.verbose)
    return 0


def print_summary(metrics: dict, cfg, run_id: str | None, verbose: bool) -> None:
    print(run_summary(metrics, cfg, run_id))
    if verbose:
        print("\n".join(f"{k:>28}: {v:.6g}" for k, v in sorted(metrics.items())))


def cmd_check(args) -> int:
    from .planning import describe_plan, plan  # deferred: as for run, only where a plan is made

    cfg = build_config(args)
    preflight.check(cfg)
    world = int(os.environ.get("WORLD_SIZE", cfg.num_gpus))
    print(f"{cfg.name}: ok\n{describe_plan(cfg, plan(cfg, world))}")
    return 0


def cmd_compare(args) -> int:
    cfg = build_config(args)
    results = compare(cfg, again=args.again)
    print(format_table(compare_table(results)))
    print(f"\n{verdict(results)}\n\nSame work?\n{same_work(results)}")
    print(f"\nOpen the runs side by side: {ui_command(cfg.tracking_uri)}")
    return 0 if all(r.status == "FINISHED" for r in results) else 1


def cmd_sweep(args) -> int:
    if not args.file:
        raise ConfigError("sweep needs -f <sweep.yaml>, for example variants/sweep_zero_stages.yaml")
    results = run_sweep(args.file, offline=args.offline or offline_requested(), overrides=flag_overrides(args))
    print(format_table(compare_table(results)))
    said = verdict(results) if len(results) > 1 else ""  # each variant against the first (none where it failed)
    if said:
        print(f"\n{said}")
    notebooks = {os.path.dirname(r.notebook) for r in results if r.notebook}
    none = "none (every variant had finished before)" if all(r.status == "FINISHED" for r in results) else "none"
    print(f"\nExecuted notebooks: {', '.join(notebooks) or none}; "
          f"runs: {ui_command(results[0].tracking_uri)}")
    return 0 if all(r.status == "FINISHED" for r in results) else 1


def cmd_bench(args) -> int:
    path = args.file or BENCH_FILE
    names = list(bench_variants(path)[1])
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError(f"--only {unknown[0]} is not a bench variant; use {', '.join(names)}")
    check_output_folder(args.out, "--out")
    baseline = read_baseline(args.baseline) if args.baseline else None  # before the run, which may write that file
    result = run_bench(args.offline or offline_requested(), args.repeats, args.untimed, args.steps, only or None,
                       args.out, args.tracking_uri, args.gpus, path)
    print(markdown(result))
    if baseline is not None:

        problems = regressions(result, baseline)
        print("\n".join(f"REGRESSION {p}" for p in problems) or f"no regression against {args.baseline}")
        return 1 if problems else 0
    return 0 if all(r["finished"] == r["repeats"] for r in result["variants"]) else 1


def read_baseline(path: str) -> dict:
    """A bench result JSON that --baseline compares against, or a ConfigError saying what is wrong with it: checked
    whole (every number regressions reads is one) before the bench runs, not found wrong after it."""
    import math

    if not os.path.isfile(path):
        raise ConfigError(f"--baseline {path} does not exist; give a bench JSON such as benchmarks/results/cpu.json")
    baseline = read_json_file(path, f"--baseline {path}", "a bench result's JSON")
    rows = baseline.get("variants") if isinstance(baseline, dict) else None
    if not isinstance(rows, list) or not rows or \
            not all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in rows):
        raise ConfigError(f"--baseline {path} holds no bench variants (a JSON object with a non-empty variants list, "
                          "as python -m dsnb bench writes)")
    for row in rows:
        for key in BASELINE_NUMBERS:
            value = row.get(key)
            if value is not None and (type(value) not in (int, float) or not math.isfinite(value)):
                raise ConfigError(f"--baseline {path}: variant {row['name'][:40]!r} has {key} {str(value)[:40]!r}; "
                                  "it must be a number or null, as python -m dsnb bench writes")
    return baseline


def cmd_capacity(args) -> int:
    if not args.file:
        raise ConfigError("capacity needs -f <capacity.yaml>, for example variants/capacity_map.yaml")
    table, fastest, _ = run_capacity(args.file, args.offline or offline_requested(), args.gpus, flag_overrides(args),
                                     args.out, only=args.only)
    print(md_table(table.drop(columns=["run_id"])), md_table(fastest), sep="\n\n")
    print(f"\nwrote {args.out}/capacity.md, .csv and .png")
    return 0


def cmd_advise(args) -> int:
    from .advise import advise, text  # deferred: transformers and torch load only where a table is made

    cfg = build_config(args)
    table = advise(cfg, args.gpu, args.gpus, args.ram, args.verify, report=lambda line: print(line, flush=True))
    print(text(table, cfg, args.top))
    return 0


def cmd_save(args) -> int:
    token = args.token or os.environ.get("HF_TOKEN", "")
    check_output_folder(args.output, "-o", empty=True)  # everything the command needs, before anything is written
    if args.push_to:
        check_push(args.push_to, token)
    from mlflow.exceptions import MlflowException

    try:
        result = RunResult.read(existing_store(args.tracking_uri), args.run_id)
    except MlflowException as e:  # only a run id the store does not hold is "not in" it
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise ConfigError(f"run {args.run_id} is not in {args.tracking_uri} ({describe(e)}); python -m dsnb ui "
                              "shows the runs it holds") from None
        raise ConfigError(f"could not read run {args.run_id} from {args.tracking_uri} ({describe(e)})") from None
    except OSError as e:  # the store's files (a folder that cannot be read, a disk error)
        raise ConfigError(f"could not read run {args.run_id} from {args.tracking_uri} ({describe(e)})") from None
    folder = save_model(result, args.output, args.merge)
    print(f"wrote {folder}" + (" (merged)" if args.merge else ""))
    if args.push_to:
        print(f"pushed to {push_to_hub(folder, args.push_to, token)}")
    return 0


def cmd_prepare(args) -> int:
    prepare()
    return 0


def cmd_export(args) -> int:
    path = export_store(store_of(args), args.output)
    print(f"wrote {path}; unzip it and run `mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1` in "
          "that folder")
    return 0


def cmd_ui(args) -> int:
    uri = existing_store(store_of(args))
    if is_server(uri):  # a server: its own UI, if it answers
        preflight.check_server(uri)
    print(ui_command(uri))
    if is_server(uri):
        return 0
    print("This binds to 127.0.0.1 only: the MLflow UI has no login. Reach it from elsewhere through an SSH tunnel.")
    return 0


COMMANDS = {"run": cmd_run, "check": cmd_check, "compare": cmd_compare, "sweep": cmd_sweep, "bench": cmd_bench,
            "capacity": cmd_capacity, "advise": cmd_advise, "save": cmd_save,
            "prepare": cmd_prepare, "export": cmd_export, "ui": cmd_ui}
