"""The command line of the training scripts (`training/*.py`, `retool-env eval`): TRL's `TrlParser`, plus three things
a user expects from a script.

- A default config that `--config` replaces: without `--config` the script reads its offline CPU smoke config, and
  every flag applies on top of it, so `grpo_trl.py --max_steps 2` is still the CPU run, two steps long. A recipe is
  one YAML file, read instead of the default, never merged with it.
- A short `--help`: the description, `--config`, the script's own arguments and the trainer's most used ones;
  `--help-all` lists every field of TRL's dataclasses.
- Mistakes on the command line or in a config file end in one line (`grpo_trl.py: error: ...`), not a traceback.
- No Hub, no wait: when the Hub cannot be reached, look-ups go to the local cache at once (`HF_HUB_OFFLINE=1`)
  instead of retrying for a minute, and a model that is not there is named with the way to fetch it.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from trl import TrlParser

CONFIGS = Path(__file__).resolve().parents[1] / "training" / "configs"

# The trainer's fields a short --help shows; --help-all shows the rest.
COMMON_FIELDS = (
    "model_name_or_path", "output_dir", "max_steps", "num_train_epochs", "learning_rate", "per_device_train_batch_size",
    "gradient_accumulation_steps", "num_generations", "max_completion_length", "max_length", "use_vllm", "vllm_mode",
    "vllm_server_base_url", "use_peft", "lora_r", "bf16", "use_cpu", "logging_steps", "save_strategy", "report_to",
    "resume_from_checkpoint", "dtype",
)


class UsageError(ValueError):
    """A mistake in the arguments (a value, a missing setting) that the user fixes; reported as one line."""


class ScriptParser(TrlParser):
    """`TrlParser` with a default config file, a short `--help` and one-line errors."""

    def __init__(self, dataclass_types: Sequence[type], *, default_config: str | Path, description: str,
                 own: Iterable[type] = (), prog: str | None = None):
        """`own`: the script's own dataclasses, listed whole in `--help`; of the others only `COMMON_FIELDS`."""
        self.default_config = Path(default_config)
        self.own = tuple(own) or tuple(dataclass_types)
        super().__init__(dataclass_types, prog=prog, description=description,
                         usage="%(prog)s [--config FILE] [--ARGUMENT VALUE ...]", formatter_class=_Formatter)
        self.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=(
            f"YAML file of any of the arguments (a recipe, see training/configs/); default: "
            f"{_display(self.default_config)}, the offline CPU smoke run. Flags override the file."))
        self.add_argument("--help-all", action=_HelpAll, help="list every argument (--help shows the most used)")
        # A progress bar on a terminal; in a log file or a pipe the trainer's per-step log lines instead.
        if any("disable_tqdm" in (f.name for f in dataclasses.fields(t)) for t in dataclass_types):
            self.set_defaults(disable_tqdm=not sys.stderr.isatty())

    def parse_args_and_config(self, args: Iterable[str] | None = None, *, with_default_config: bool = True,
                              **kwargs: Any) -> tuple[Any, ...]:
        """The dataclasses from `--config FILE` (default: the CPU smoke config; none with `with_default_config=False`)
        and the command line, which wins."""
        args = list(sys.argv[1:] if args is None else args)
        if "--config" not in args:
            if not with_default_config:
                return self._parse(args, None, **kwargs)
            args = ["--config", str(self.default_config), *args]
        elif args.index("--config") == len(args) - 1:
            self.error("--config needs a YAML file")
        config = Path(args[args.index("--config") + 1])
        if not config.is_file():
            default = (" (the default config: install the repository with pip install -e)"
                       * (config == self.default_config))
            self.error(f"--config {config}: no such file{default}")
        return self._parse(args, config, **kwargs)

    def _parse(self, args: list[str], config: Path | None, **kwargs: Any) -> tuple[Any, ...]:
        try:
            return super().parse_args_and_config(args, **kwargs)
        except ValueError as exc:  # a field's own validation, or an unknown key in the file
            self.error(f"{exc}" + (f" (config: {_display(config)})" if config else ""))  # exits
            raise  # unreachable: argparse's error exits

    def format_help(self) -> str:
        """The short help: the script's own arguments in full, the trainer's most used ones."""
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        formatter.add_text(self.description)
        own_fields = {f.name for t in self.own for f in dataclasses.fields(t)}
        formatter.start_section("options")
        formatter.add_arguments([a for a in self._actions if a.option_strings[:1] in (["-h"], ["--config"],
                                                                                   ["--help-all"])])
        formatter.end_section()
        for dtype in self.dataclass_types:
            names = {f.name for f in dataclasses.fields(dtype)}
            shown = names if dtype in self.own else names & set(COMMON_FIELDS) - own_fields
            actions = [a for a in self._actions if a.dest in shown and not a.option_strings[0].startswith("--no_")]
            if not actions:
                continue
            if dtype in self.own:
                formatter.start_section(dtype.__name__)
                formatter.add_text(" ".join((dtype.__doc__ or "").split("\n\n")[0].split()))
            else:  # TRL's help strings run to paragraphs: their first sentence
                formatter.start_section(f"{dtype.__name__} (TRL; the most used, --help-all lists all)")
                actions = [_first_sentence(a) for a in actions]
            formatter.add_arguments(actions)
            formatter.end_section()
        formatter.add_text(self.epilog)
        return formatter.format_help()

    def format_full_help(self) -> str:
        return super().format_help()

    def error(self, message: str):
        """One line and exit status 2, as argparse does, with the usage line kept short."""
        self.exit(2, f"{self.prog}: error: {message}\n")


class _Formatter(argparse.HelpFormatter):
    """Options as `--name` alone (no metavar, no dashed alias): a help line per argument, not three."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32, width=min(120, shutil.get_terminal_size().columns))

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if action.option_strings[0] == "-h":
            return ", ".join(action.option_strings)
        return " ".join([action.option_strings[0], *([str(action.metavar)] if action.metavar else [])])

    def _get_help_string(self, action: argparse.Action) -> str:
        """The help, and the value in force (the config file's, else the field's default)."""
        if action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
            return action.help or ""
        return f"{action.help or ''} [{action.default}]"


def _first_sentence(action: argparse.Action) -> argparse.Action:
    short = copy.copy(action)
    short.help = re.split(r"(?<=[a-z0-9)`])\. ", action.help or "", maxsplit=1)[0].rstrip(".")
    return short


class _HelpAll(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(parser.format_full_help(), sys.stdout)
        parser.exit()


def run(main: Callable[..., Any], parser: ScriptParser, args: Sequence[str] | None = None) -> Any:
    """Parse, then run `main(*dataclasses)`; a `UsageError` (or a dataset or file that cannot be found) ends in one
    line naming the fix, every other exception in its traceback."""
    from retool_env.data import DatasetUnavailableError
    from retool_env.data.loaders import go_offline, hub_reachable

    parsed = parser.parse_args_and_config(args)
    if not hub_reachable():
        go_offline()
    if not sys.stderr.isatty():  # a log file or a pipe: no download or loading bars, one line each
        import transformers

        transformers.utils.logging.disable_progress_bar()
    try:
        return main(*parsed)
    except (UsageError, DatasetUnavailableError, FileNotFoundError, ModuleNotFoundError) as exc:
        parser.error(str(exc))


def load_tokenizer(name: str, **kwargs: Any):
    """`AutoTokenizer.from_pretrained`, with a `UsageError` naming the fix when the model is nowhere to be found."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, **kwargs)
    except OSError as exc:
        from huggingface_hub import constants

        where = ("the Hub cannot be reached, so only the local cache was searched" if constants.HF_HUB_OFFLINE
                 else "nor on the Hub")
        raise UsageError(f"cannot load the tokenizer of {name!r}: not a local folder, not in the Hub cache ({where}); "
                         f"pass a local folder, or fetch it first on a machine with access: hf download {name}"
                         ) from exc


def load_policy(model_args: Any, training_args: Any) -> Any:
    """The tokenizer of the model the script trains, and the model's loading settings in the trainer's
    `model_init_kwargs`; without a model, a tiny random Qwen2 built offline (seconds), so the script runs anywhere."""
    if model_args.model_name_or_path is None:
        from retool_adapters.offline_models import build_tiny_qwen

        model_args.model_name_or_path = str(build_tiny_qwen(Path(training_args.output_dir) / "tiny-model"))
    tokenizer = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }
    return tokenizer


def _display(path: Path) -> str:
    """A path relative to the working directory when it is inside it (the repository root, usually)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
