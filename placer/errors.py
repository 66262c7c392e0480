"""Exceptions raised by placer.

Every error a user can cause derives from :class:`PlacerError`; the command
line prints its message on one line and exits with status 2. Anything else
escaping placer is a bug.
"""

__all__ = [
    "PlacerError",
    "FormatError",
    "GraphCycleError",
    "InvalidPlanError",
    "InfeasibleError",
    "TimeLimitError",
    "OptionError",
    "ClusterMismatchWarning",
]


class PlacerError(Exception):
    """Base class of every error caused by input, options or an impossible problem."""


class FormatError(PlacerError, ValueError):
    """A graph, cluster, plan or profile document is malformed.

    The message names the file (when known) and the node, edge, device or
    field at fault.
    """


class GraphCycleError(FormatError):
    """The edges of a graph do not form a DAG; the message names nodes on a cycle."""


class InvalidPlanError(PlacerError):
    """A plan breaks a rule of the reference model (FORMATS.md rule 8 or memory)."""


class InfeasibleError(PlacerError):
    """No valid plan exists, or the algorithm asked could not find one."""


class TimeLimitError(InfeasibleError):
    """The algorithm found no plan within its ``time_limit``: give it more time, or pick a faster one."""


class OptionError(PlacerError, ValueError):
    """An algorithm or command option is unknown or has a bad value."""


class ClusterMismatchWarning(UserWarning):
    """A plan is checked on a cluster other than the one it was made for (its figures were predicted there)."""
