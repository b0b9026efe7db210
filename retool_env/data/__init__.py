"""Problems for the environment: dataset loaders, the offline procedural task generator, cold-start data."""

from retool_env.data.problem import Problem

__all__ = ["Problem"]
