"""`retool-env` command line. Import-light: each subcommand imports what it needs when it runs."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence


def _sandbox_serve(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from retool_env.sandbox.http_server import is_loopback, serve, server_token

    if args.no_auth and not (args.unix_socket or is_loopback(args.host)):
        print(f"retool-env sandbox serve: --no-auth only on a loopback address or a unix socket, not {args.host}",
              file=sys.stderr)
        return 2
    try:
        token, source = (None, "none") if args.no_auth else server_token(args.token_file)
    except (OSError, ValueError) as exc:
        print(f"retool-env sandbox serve: no token: {exc}", file=sys.stderr)
        return 2
    if args.workers > 1 and (args.unix_socket or args.port == 0):
        print("retool-env sandbox serve: --workers needs a TCP port of its own (not 0, not --unix-socket)",
              file=sys.stderr)
        return 2
    concurrency = args.max_concurrency or max(1, 2 * (os.cpu_count() or 1) // args.workers)
    kwargs = {"timeout": args.timeout, "memory_mb": args.memory_mb, "max_concurrency": concurrency,
              "isolation": args.isolation, "require": args.require}
    options = {"token": token, "token_source": source, "unix_socket": args.unix_socket, "echo": args.echo,
               "read_timeout": args.read_timeout, "max_inflight_bytes": args.max_inflight_mb << 20,
               "nonce_dir": args.nonce_dir}

    async def serve_until_signalled(worker: int) -> None:
        # Ctrl-C and `kill` both stop the server cleanly; set explicitly, because a server started in the background
        # (`retool-env sandbox serve &`) inherits SIGINT ignored, and SIGTERM would otherwise skip the cleanup.
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None  # a coroutine run by asyncio.run
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(args.host, args.port, worker=(worker, args.workers), **options, **kwargs)

    if args.workers == 1:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_until_signalled(0))
        return 0
    return _serve_workers(args.workers, lambda worker: asyncio.run(serve_until_signalled(worker)))


def _serve_workers(count: int, run: Callable[[int], None]) -> int:
    """`count` processes on one port (SO_REUSEPORT; the kernel spreads the connections), each with its own sandbox
    server, so a node's cores are not all fed by one zygote. Forked before any event loop; stopped together."""
    import signal

    pids = []
    for worker in range(count):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                with contextlib.suppress(KeyboardInterrupt):
                    run(worker)
            except BaseException:
                code = 1
                raise
            finally:
                os._exit(code)
        pids.append(pid)

    def stop(*_: object) -> None:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    codes = []
    for pid in pids:
        while True:
            try:
                codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
                break
            except InterruptedError:
                continue
        stop()  # one worker gone: the port must not stay half served
    return max(codes, default=0)


def _plant_dataset_canary() -> tuple[str, str]:
    """A world-readable dataset file with a gold answer at a random host path (the working directory if it is
    writable, else /tmp): model code must not find it. Returns (its directory, the secret)."""
    import json
    import secrets
    import tempfile

    secret = secrets.token_hex(16)
    for parent in (os.getcwd(), tempfile.gettempdir()):
        with contextlib.suppress(OSError):
            directory = tempfile.mkdtemp(prefix=".retool-doctor-dataset-", dir=parent)
            os.chmod(directory, 0o755)
            path = os.path.join(directory, "train.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"problem": "1 + 1", "answer": secret}) + "\n")
            os.chmod(path, 0o644)
            return directory, secret
    raise OSError("doctor: cannot plant a canary in the working directory or /tmp")


def _doctor(args: argparse.Namespace) -> int:
    """Every isolation layer as measured in a confined child, then one live attack per class, then a planted
    dataset file that model code must not find."""
    import shutil
    import time

    from retool_env.sandbox import LocalSandbox
    from retool_env.sandbox.forkserver import isolation, probes

    start = time.perf_counter()
    directory, secret = _plant_dataset_canary()
    try:
        with LocalSandbox(timeout=5, require=args.require) as sandbox:
            rows = sandbox.layers()
            print(f"Sandbox isolation layers on this machine (view: {sandbox.wrapper}; measured in a child):")
            for layer in rows:
                print(f"  [{'on ' if layer.active else 'off'}] {layer.name:<22} {layer.detail}")
            result = sandbox.run_sync("print(6 * 7)")
            print(f"\nLive check: the server started and ran a call in {time.perf_counter() - start:.2f} s: "
                  f"{result.status} {result.output.strip()!r}")
            print("Attacks (model code trying each; `contained` means it failed):")
            escaped = 0
            for name in probes.ATTACKS:
                probe = sandbox.run_sync(probes.code(name))
                lines = probe.output.strip().splitlines()
                verdict = "ESCAPED" if probes.escaped(probe.output) else "contained"
                escaped += verdict == "ESCAPED"
                print(f"  {name:<24} {verdict:<9} {(lines or [''])[-1][:80]}")
            probe = sandbox.run_sync(probes.dataset_code(directory), timeout=60)
            found = secret in probe.output
            escaped += found
            print(f"  {'a planted dataset':<24} {'ESCAPED' if found else 'contained':<9} "
                  f"{directory}/train.jsonl (mode 0644): {probe.output.strip().splitlines()[-1][:60]}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    root = os.geteuid() == 0
    missing = [row.name for row in isolation.required(rows, root=root) if not row.active]
    print(f"\n{len(missing)} layer(s) missing{': ' + ', '.join(missing) if missing else ''}; "
          f"{escaped} attack(s) escaped.")
    strict_failed = args.require == "strict" and bool(missing)
    return 0 if result.ok and not escaped and not strict_failed else 1


def _eval(eval_args: Sequence[str]) -> int:
    """`retool-env eval` is the adapters' command (the generation backends live there, the `train` extra for hf),
    found through the `retool_env.commands` entry point they register, so that retool_env never imports them."""
    from importlib.metadata import entry_points

    found = entry_points(group="retool_env.commands", name="eval")
    if not found:
        sys.exit("retool-env eval: error: no `eval` command is installed (the retool_adapters package registers it): "
                 "pip install -e '.[train]'")
    try:
        eval_main = next(iter(found)).load()
    except ModuleNotFoundError as exc:
        sys.exit(f"retool-env eval: error: needs the train extra (missing {exc.name}): pip install -e '.[train]'")
    eval_main(list(eval_args))
    return 0


def _regrade(args: argparse.Namespace) -> int:
    """Re-score stored episode records with a grader and report disagreements with the logged verdicts, answers
    and rewards."""
    import json

    from retool_env.records import read_records, regrade

    try:
        report = regrade(read_records(args.records), args.grader, max_examples=args.examples)
    except (OSError, ValueError) as exc:
        print(f"retool-env regrade: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        print(report.summary())
        for example in report.examples:
            print(f"- {example['problem_id']} (policy version {example['policy_version']}): gold {example['gold']!r}; "
                  f"logged pred {example['pred_logged']!r} correct={example['correct_logged']} "
                  f"reward={example['reward_logged']}; now pred {example['pred_now']!r} "
                  f"correct={example['correct_now']} reward={example['reward_now']}")
    return 1 if args.fail_on_disagreement and report.disagreements else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retool-env", description="ReTool-Env: a code-interpreter gym for LLMs.")
    commands = parser.add_subparsers(dest="command", required=True)
    defaults = argparse.ArgumentDefaultsHelpFormatter

    sandbox = commands.add_parser("sandbox", help="the code sandbox", description="The code sandbox.")
    sandbox_commands = sandbox.add_subparsers(dest="sandbox_command", required=True)
    serve = sandbox_commands.add_parser(
        "serve", formatter_class=defaults, help="a SandboxFusion-compatible /run_code server over the local sandbox",
        description="Serve the local sandbox over SandboxFusion's API (POST /run_code), for tools written for "
                    "SandboxFusion (verl's, the sandbox-fusion client). Calls need the printed token. Ctrl-C or kill "
                    "stops it.")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on")
    serve.add_argument("--timeout", type=float, default=10.0, help="run_timeout in seconds when a request sets none")
    serve.add_argument("--memory-mb", type=int, default=1024, help="memory limit per call when a request sets none")
    serve.add_argument("--max-concurrency", type=int, default=None, help="calls executing at once; None: one per CPU")
    serve.add_argument("--isolation", default="auto", choices=["auto", "namespaces", "none"],
                       help="the sandbox's own namespaces and read-only view; none needs --require none (see `doctor`)")
    serve.add_argument("--workers", type=int, default=1,
                       help="server processes sharing the port, each with its own sandbox (a node's cores, past one "
                            "process's fork rate)")
    serve.add_argument("--require", choices=["safe", "strict", "none"], default="safe",
                       help="safe: refuse to start without a read-only view and, as root, a uid per call; strict: "
                            "without every layer; none: start anyway (see `doctor`)")
    serve.add_argument("--unix-socket", default=None, help="listen on this unix socket (mode 0600), not host:port")
    serve.add_argument("--token-file", default=None,
                       help="read the bearer token from this file (else $RETOOL_SANDBOX_TOKEN, else a new one, "
                            "printed)")
    serve.add_argument("--no-auth", action="store_true",
                       help="accept calls without a token; only on a loopback host or a unix socket")
    serve.add_argument("--echo", action="store_true",
                       help="print the value of a trailing expression, like Jupyter (SandboxFusion never does)")
    serve.add_argument("--read-timeout", type=float, default=30.0, help="seconds a client may take to send a request")
    serve.add_argument("--max-inflight-mb", type=int, default=256,
                       help="request bodies held at once, all connections together (over it: HTTP 503)")
    serve.add_argument("--nonce-dir", default=None,
                       help="where signed requests' nonces are kept, so each runs once across workers and restarts "
                            "(default: one directory per token under $XDG_RUNTIME_DIR or the temp directory)")
    serve.set_defaults(func=_sandbox_serve)

    doctor = commands.add_parser(
        "doctor", formatter_class=defaults, help="measure the sandbox's isolation layers and try one attack per class",
        description="Measure every isolation layer of the local sandbox from inside a child, then try one live attack "
                    "per class. Exit status 1 when an attack escapes.")
    doctor.add_argument("--require", choices=["safe", "strict", "none"], default="safe",
                        help="safe: refuse to start without a read-only view and, as root, a uid per call; strict: "
                             "fail when any layer is missing; none: measure whatever this machine allows")
    doctor.set_defaults(func=_doctor)

    regrade = commands.add_parser(
        "regrade", formatter_class=defaults, help="re-score stored episode records and report disagreements",
        description="Re-grade the episodes of a records file (ReToolRollout(records_path=...)) with a grader, "
                    "recompute their rewards with the scheme each record names, and report where verdicts, rewards "
                    "or (default, strict) extracted answers differ from the logged ones, with examples. With the "
                    "grader training used, the rewards are reproduced exactly.")
    regrade.add_argument("records", help="a JSONL file of episode records")
    regrade.add_argument("--grader", choices=["default", "math_verify", "strict"], default="default",
                         help="default: the project's grader; math_verify: math-verify's own extraction and "
                              "comparison; strict: verl's strict box check")
    regrade.add_argument("--examples", type=int, default=10, help="disagreements to show")
    regrade.add_argument("--json", action="store_true", help="print the whole report as JSON")
    regrade.add_argument("--fail-on-disagreement", action="store_true",
                         help="exit with status 1 when any verdict, extracted answer or reward differs")
    regrade.set_defaults(func=_regrade)

    evaluate = commands.add_parser("eval", add_help=False, help="evaluate a model with and without the tool, under a "
                                   "published protocol (retool_adapters.eval_cli; --help for its options)")
    evaluate.add_argument("eval_args", nargs=argparse.REMAINDER, help="arguments of the evaluation")
    evaluate.set_defaults(func=lambda args: _eval(args.eval_args))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["eval"]:  # everything after `eval` belongs to the evaluation, --help included
        return _eval(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
