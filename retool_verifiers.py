"""The verifiers v1 plugin module: `vf-eval retool_verifiers` (verifiers imports a taskset id as a top-level module,
so `retool_adapters.verifiers` cannot be one). Everything lives in `retool_adapters.verifiers`."""

from retool_adapters.verifiers import (
    EXECUTE_PYTHON_TOOL,
    ReToolData,
    ReToolHarness,
    ReToolHarnessConfig,
    ReToolTask,
    ReToolTaskset,
    ReToolTasksetConfig,
)

__all__ = ["EXECUTE_PYTHON_TOOL", "ReToolData", "ReToolHarness", "ReToolHarnessConfig", "ReToolTask",
           "ReToolTaskset", "ReToolTasksetConfig"]
