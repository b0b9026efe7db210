"""The README and the pages in docs/ run as written: every ```python block is complete (it compiles, with no
top-level await) and, unless its first line says what else it needs (`# Needs ...`: a GPU, the Hub, a framework, a
server), runs offline on a CPU from the repository root; every command line of the training scripts in a ```bash
block parses."""

from __future__ import annotations

import ast
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(language: str, pages: list[Path] = PAGES) -> list[tuple[str, str]]:
    """(page: section heading, code) of each fenced block in that language, in order."""
    found = []
    for page in pages:
        heading = "top"
        text = page.read_text()
        for match in re.finditer(rf"^(#{{2,4}} [^\n]*)$|^```{language}\n(.*?)^```$", text, flags=re.M | re.S):
            if match.group(1):
                heading = match.group(1).lstrip("# ")
            else:
                found.append((f"{page.relative_to(ROOT)}: {heading}", match.group(2)))
    return found


PYTHON = blocks("python")
IDS = [f"{i}-{re.sub(r'[^a-z0-9]+', '-', where.lower()).strip('-')}" for i, (where, _) in enumerate(PYTHON)]


def test_the_pages_have_python_blocks_and_mark_the_ones_they_do_not_run():
    assert len(PYTHON) >= 15
    assert blocks("python", [ROOT / "README.md"]), "the README keeps a runnable example"
    needs = [code for _, code in PYTHON if code.startswith("# Needs ")]
    assert 0 < len(needs) < len(PYTHON) // 2


def test_the_readme_links_every_page_in_docs():
    readme = (ROOT / "README.md").read_text()
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages
    assert [p.name for p in pages if f"](docs/{p.name})" not in readme] == []


def test_relative_links_between_pages_point_at_files_that_exist():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def private_imports(code: str) -> list[str]:
    """The names a block imports from another package's private module or as a private name (`_common`,
    `_helper`)."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            parts = [*node.module.split("."), *(alias.name for alias in node.names)]
            found += [f"{node.module}: {p}" for p in parts if p.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if any(p.startswith("_") for p in alias.name.split("."))]
    return found


def test_the_extension_examples_need_only_public_names():
    examples = blocks("python", [ROOT / "docs" / "extending.md"])
    assert len(examples) >= 4  # a tool format, a reward, a sandbox backend, a framework adapter
    assert [found for _, code in examples if (found := private_imports(code))] == []
    assert private_imports("from retool_adapters.generators._common import TurnGenerator")  # the check can fail


class BlockRunner:
    """tests/block_zygote.py as a subprocess: each block runs in a child forked from it, as `python -c` would run it,
    without importing torch and transformers again for every block."""

    def __init__(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "block_zygote.py")], env=env,
                                        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.read(timeout=120) == {"ready": True}

    def read(self, timeout: float) -> dict:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            raise TimeoutError(f"no answer from the block runner in {timeout} s")
        return json.loads(line)

    def run(self, code: str, folder: Path, timeout: float) -> tuple[int, str, str]:
        """(returncode, stdout, stderr) of the block run in `folder`."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"code": code, "folder": str(folder)}) + "\n")
        self.process.stdin.flush()
        pid = self.read(timeout=30)["pid"]
        try:
            returncode = self.read(timeout=timeout)["returncode"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self.read(timeout=30)
            raise
        return returncode, (folder / "stdout.txt").read_text(), (folder / "stderr.txt").read_text()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def block_runner():
    runner = BlockRunner()
    yield runner
    runner.close()


@pytest.mark.parametrize("code", [code for _, code in PYTHON], ids=IDS)
def test_python_block_runs(code, tmp_path, block_runner):
    compile(code, "README.md", "exec")  # a complete program: no top-level await, no syntax of a fragment
    if code.startswith("# Needs "):
        pytest.skip(code.splitlines()[0])
    (tmp_path / "tests").symlink_to(ROOT / "tests")  # the fixtures, by the pages' relative paths; outputs stay here
    returncode, stdout, stderr = block_runner.run(code, tmp_path, timeout=280)
    assert returncode == 0, f"{stdout[-2000:]}\n{stderr[-4000:]}"


def test_the_block_runner_runs_a_block_as_a_program(tmp_path, block_runner):
    """Fresh globals as `__main__`, the project not imported for it, exit codes and output kept."""
    code = ("import sys; assert __name__ == '__main__' and 'retool_env' not in sys.modules and sys.path[0] == ''\n"
            "print('out'); print('err', file=sys.stderr); sys.exit(3)")
    assert block_runner.run(code, tmp_path, timeout=60) == (3, "out\n", "err\n")
    assert block_runner.run("gym.make", tmp_path, timeout=60)[0] == 1  # names a block never imported stay unknown
    assert block_runner.run("raise ValueError('no')", tmp_path, timeout=60)[2].endswith("ValueError: no\n")


def script_commands() -> list[list[str]]:
    """The training scripts' command lines in the pages' bash blocks: [script, *arguments]."""
    commands = []
    for _, code in blocks("bash"):
        for line in code.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for i, word in enumerate(words):
                if word.endswith(("training/sft_trl.py", "training/grpo_trl.py", "training/eval.py")):
                    commands.append([Path(word).name, *words[i + 1:]])
                elif word == "retool-env" and words[i + 1:i + 2] == ["eval"]:
                    commands.append(["eval.py", *words[i + 2:]])
    return commands


@pytest.mark.parametrize("command", script_commands(), ids=" ".join)
def test_script_command_line_parses(command, monkeypatch):
    from retool_adapters import eval_cli
    from training import grpo_trl, sft_trl

    monkeypatch.chdir(ROOT)
    script, *args = command
    make_parser = {"sft_trl.py": sft_trl.make_parser, "grpo_trl.py": grpo_trl.make_parser,
                   "eval.py": eval_cli.make_parser}[script]
    if script != "eval.py":
        args += ["--use_cpu", "true"]  # bf16 recipes validate only on a GPU or with use_cpu
    if "--async" in args:  # grpo_trl.py picks AsyncGRPOTrainer's config classes before parsing
        args.remove("--async")
        grpo_trl.make_parser(asynchronous=True).parse_args_and_config(args)
        return
    make_parser().parse_args_and_config(args)


def test_the_pages_name_every_command_they_promise():
    commands = {" ".join(c[:1]) for c in script_commands()}
    assert commands == {"sft_trl.py", "grpo_trl.py", "eval.py"}
