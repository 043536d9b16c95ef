"""This process's place in a run: rank 0 of 1 normally, one of N under FSDP; and the few collectives a run needs.

Every process of a distributed run executes the whole of `grpo train` (TRL's training steps are collective), so
what must happen once (writing the run directory, printing, grading the held-out tasks) happens on rank 0 only,
and the decisions every rank must share (stop for the cost cap) are taken there and broadcast.
"""

from __future__ import annotations

import os
from typing import Any


class Ranks:
    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist: Any = dist if dist.is_available() and dist.is_initialized() else None
        self.rank = self._dist.get_rank() if self._dist else 0
        self.world = self._dist.get_world_size() if self._dist else 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def barrier(self) -> None:
        if self._dist is not None:
            self._dist.barrier()

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value`, on every rank."""
        if self._dist is None:
            return value
        box = [value]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank."""
        if self._dist is None:
            return [value]
        values: list[Any] = [None] * self.world
        self._dist.all_gather_object(values, value)
        return values
