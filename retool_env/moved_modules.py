"""Old import paths of moved modules: each keeps importing for one release, with a DeprecationWarning naming the new
path, attributed to the line that imported it (so Python's default filters show it in a user's script)."""

from __future__ import annotations

import importlib
import sys
import warnings


def alias_moved_module(old: str, new: str) -> None:
    """Make `old` the module `new` itself (private names too) and warn whoever imported `old`."""
    # 3: past this function and the old module's body; `warnings` itself skips importlib's frames.
    warnings.warn(f"{old} moved to {new}: import {new} (the old path goes in the next release)", DeprecationWarning,
                  stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
