"""The unit of work: one math problem with its gold answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """A raw problem statement (never an already-templated prompt) and its gold answer as a string."""

    question: str
    answer: str
    id: str = ""
    source: str = ""
    level: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "id": self.id, "source": self.source,
                "level": self.level, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Problem:
        return cls(question=row["question"], answer=str(row["answer"]), id=str(row.get("id", "")),
                   source=row.get("source", ""), level=row.get("level"), metadata=dict(row.get("metadata") or {}))
