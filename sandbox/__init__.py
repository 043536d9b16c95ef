"""nodus.sandbox: grade completions in nsjail sandboxes, never in the trainer's process.

    from nodus.sandbox import GraderPool, SandboxLimits
    with GraderPool(SandboxLimits(wall_time_s=5), workers=2, isolate_each_completion=True) as pool:
        outcomes = pool.run_many([{"target": "nodus.sandbox.programs:run_python",
                                   "payload": {"code": "print(1)", "expected_stdout": "1"}}])
"""

from .errors import SandboxUnavailable, UnsandboxedGradingWarning
from .jail import check_sandbox_available
from .limits import SandboxLimits
from .outcome import GradeOutcome, PoolStats
from .pool import GraderPool

__all__ = [
    "GradeOutcome",
    "GraderPool",
    "PoolStats",
    "SandboxLimits",
    "SandboxUnavailable",
    "UnsandboxedGradingWarning",
    "check_sandbox_available",
]
