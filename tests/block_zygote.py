"""Runs the pages' python blocks as programs without paying the heavy imports for each one (tests/test_readme.py).

Started once per test session, it imports the third-party libraries the blocks use (torch, transformers, trl, ...),
never the project's own packages, so a block that forgets to import `retool_env` still fails as it would for a user.
Then, for each request on stdin (a JSON line: the block's code and the folder to run it in), it forks a child that
runs the block as `python -c` would, in a fresh `__main__`, its output in two files of that folder, and writes back
`{"pid": ...}` at the start and `{"returncode": ...}` at the end. The child exits through the atexit handlers, as a
program does.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import traceback
import types


def preload() -> None:
    import gymnasium  # noqa: F401
    import jinja2  # noqa: F401
    import numpy  # noqa: F401
    import sympy  # noqa: F401
    import torch  # noqa: F401
    import transformers
    import trl

    for name in ("AutoTokenizer", "AutoModelForCausalLM", "PreTrainedTokenizerFast", "Qwen2Config"):
        getattr(transformers, name)
    for name in ("GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer"):
        getattr(trl, name)


def run_block(code: str, folder: str) -> None:
    """The child: `python -c code` in `folder`; never returns."""
    os.chdir(folder)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # stdin is the requests' pipe
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def serve() -> None:
    sys.path[0] = ""  # as `python -c` has it: the working folder, not this file's (tests/vllm is not vLLM)
    preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_block(request["code"], request["folder"])
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()
