"""Moved to `retool_env.coldstart`; imports with a DeprecationWarning until the next release."""

from retool_env.moved_modules import alias_moved_module

alias_moved_module(__name__, "retool_env.coldstart")
