"""Code executors behind one async interface: `await sandbox.run(code, timeout=...) -> ExecResult`.

- `LocalSandbox`: the embedded default, a pre-warmed fork server on this machine.
- `SandboxFusionSandbox`: a client for a SandboxFusion `/run_code` service.
- `SandboxFusionPool`: several SandboxFusion endpoints as one, with routing, back-pressure, failover and stats.
- `RaySandbox` (`retool_env.sandbox.ray_pool`, the `ray` extra): `LocalSandbox` actors over a Ray cluster's nodes.

`base` holds the contract (`Sandbox`, `ExecResult`, `ToolStatus`); `local` is `LocalSandbox`'s client side, and
the fork server it starts (server, zygote, confined children, isolation, seccomp, cgroups, uid blocks) lives in
`forkserver/`. `http_server` serves the local sandbox as SandboxFusion's `/run_code`.
"""

from __future__ import annotations

import ast
from typing import Any

from .base import ExecResult, Sandbox, ToolStatus
from .fusion import SandboxFusionSandbox
from .local import LocalSandbox
from .pool import SandboxFusionPool

__all__ = ["ExecResult", "LocalSandbox", "Sandbox", "SandboxFusionPool", "SandboxFusionSandbox", "ToolStatus",
           "make_sandbox"]


def make_sandbox(spec: str | Sandbox | None = "local", **kwargs: Any) -> Sandbox:
    """Build a sandbox from a name: `local`, `ray[:key=value,...]`, `sandbox_fusion:<url>[,<url>...]` or
    `sandbox_fusion:@<file of URLs>` (several: a `SandboxFusionPool`), an http(s) URL, or an existing instance.
    `ray:resource=sandbox,resource_per_actor=1` passes `RaySandbox` arguments from a config file.
    """
    if isinstance(spec, Sandbox):
        return spec
    if spec is None or spec == "local":
        return LocalSandbox(**kwargs)
    if spec == "ray" or spec.startswith("ray:"):
        try:
            from .ray_pool import RaySandbox
        except ImportError as exc:
            raise ImportError(f"sandbox 'ray' needs Ray: pip install 'retool-env[ray]' ({exc})") from exc
        options = dict(item.split("=", 1) for item in spec.removeprefix("ray").removeprefix(":").split(",") if item)
        return RaySandbox(**{key: _literal(value) for key, value in options.items()}, **kwargs)
    if spec.startswith("sandbox_fusion:"):
        urls = spec.removeprefix("sandbox_fusion:")
        if urls.startswith("@"):
            return SandboxFusionPool(urls[1:], **kwargs)
        if "," in urls:
            return SandboxFusionPool(urls.split(","), **kwargs)
        return SandboxFusionSandbox(urls, **kwargs)
    if spec.startswith(("http://", "https://")):
        return SandboxFusionSandbox(spec, **kwargs)
    raise ValueError(f"unknown sandbox {spec!r}; use 'local', 'ray', 'sandbox_fusion:http://host:port/run_code' or "
                     "a URL")


def _literal(text: str) -> Any:
    """`8` -> 8, `auto` -> "auto": option values written in a config string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
