"""ReTool-Env: a token-level gym environment for LLMs that solve math with a code interpreter."""

__version__ = "0.1.0"
