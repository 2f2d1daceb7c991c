"""Item kinds the service knows: ``kind`` -> scorer class. A new kind is one more line here."""

from __future__ import annotations

from services.reward.base import Scorer
from services.reward.code_scorer import CodeScorer
from services.reward.math_scorer import MathScorer

SCORERS: dict[str, type[Scorer]] = {
    MathScorer.kind: MathScorer,
    CodeScorer.kind: CodeScorer,
}
