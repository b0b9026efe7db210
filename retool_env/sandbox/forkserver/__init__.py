"""The local fork server behind `LocalSandbox` (local.py, the client): everything that runs outside the trainer.

One job per module: `isolation` (the namespaces and allowlist view the server runs in, and the report of every
layer), `start` (the entry point), `config` (what the client decides, the two zygotes' preloads, which one a call
needs), `server` (scheduling: the pools, the concurrency limit, sessions), `zygote` (forks every child, reaps them,
cleans up after them), `confine` (what a child does to itself before it sees code), `child` (waiting for code,
single-use and session heads), `cell` (running one cell, the output buffer), `seccomp`, `cgroups`, `uids` (each
server's own block of uids), `protocol` (framing), `probes` (the doctor's live attacks).

The server imports this package without `retool_env/__init__.py` or `retool_env/sandbox/__init__.py` (local.py's
bootstrap): keep this module free of imports.
"""
