"""What an all-reduce built from point-to-point messages counts on one rank: bytes and messages each way, and the
steps it took. Counted where the messages are posted (`count_send`, `count_recv`), so the counts are the ring's own
and can be compared with the dispatcher's records (`checks.probes.comm.record_comm`) and with the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class StepRecord:
    """One step as this rank ran it: which chunk it sent right and which it received from the left."""

    phase: str
    k: int
    send_chunk: int
    recv_chunk: int
    numel: int  # elements of each message of this step (one chunk)

    def as_tuple(self) -> tuple[str, int, int, int]:
        return (self.phase, self.k, self.send_chunk, self.recv_chunk)


@dataclass
class Traffic:
    rank: int
    world_size: int
    sent_bytes: int = 0
    received_bytes: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    padding_numel: int = 0
    chunk_numel: int = 0

    def count_send(self, tensor: torch.Tensor) -> None:
        self.sent_bytes += tensor.numel() * tensor.element_size()
        self.messages_sent += 1

    def count_recv(self, tensor: torch.Tensor) -> None:
        self.received_bytes += tensor.numel() * tensor.element_size()
        self.messages_received += 1

    def as_dict(self) -> dict[str, Any]:
        """Plain data, returnable from a rank."""
        return {
            "rank": self.rank,
            "sent_bytes": self.sent_bytes,
            "received_bytes": self.received_bytes,
            "messages_sent": self.messages_sent,
            "messages_received": self.messages_received,
            "steps": [s.as_tuple() for s in self.steps],
            "chunk_numel": self.chunk_numel,
            "padding_numel": self.padding_numel,
        }
