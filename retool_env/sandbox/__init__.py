"""Code executors behind one async interface: `await sandbox.run(code, timeout=...) -> ExecResult`.

- `LocalSandbox`: the embedded default, a pre-warmed fork server on this machine.
- `SandboxFusionSandbox`: a client for a SandboxFusion `/run_code` service.

The local sandbox, one job per module: `local` (the client: starts the server, sends requests), `isolation` (the
namespace wrapper the server runs in, and the report of every layer), `server` (scheduling: the pool, the
concurrency limit, sessions), `zygote` (forks every child, reaps them, cleans up after them), `confine` (what a
child does to itself before it sees code), `child` (waiting for code, single-use and session heads), `cell` (running
one cell, the output buffer), `seccomp`, `cgroups`, `protocol` (framing), `probes` (the doctor's live attacks).
`http_server` serves the local sandbox as SandboxFusion's `/run_code`.
"""

from __future__ import annotations

from typing import Any

from .base import ExecResult, Sandbox
from .fusion import SandboxFusionSandbox
from .local import LocalSandbox

__all__ = ["ExecResult", "LocalSandbox", "Sandbox", "SandboxFusionSandbox", "make_sandbox"]


def make_sandbox(spec: str | Sandbox | None = "local", **kwargs: Any) -> Sandbox:
    """Build a sandbox from a name: `local`, `sandbox_fusion:<url>`, an http(s) URL, or an existing instance."""
    if isinstance(spec, Sandbox):
        return spec
    if spec is None or spec == "local":
        return LocalSandbox(**kwargs)
    if spec.startswith("sandbox_fusion:"):
        return SandboxFusionSandbox(spec.removeprefix("sandbox_fusion:"), **kwargs)
    if spec.startswith(("http://", "https://")):
        return SandboxFusionSandbox(spec, **kwargs)
    raise ValueError(f"unknown sandbox {spec!r}; use 'local', 'sandbox_fusion:http://host:port/run_code' or a URL")
