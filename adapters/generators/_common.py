"""The old name of `retool_adapters.generators.base`, kept importable."""

from .base import *  # noqa: F403
from .base import __all__  # noqa: F401
