"""Item kinds the service knows: ``kind`` -> scorer class. A new kind is one more line here."""

from __future__ import annotations

from services.reward.base import Scorer
from services.reward.code_scorer import CodeScorer
from services.reward.judge_scorer import JudgeScorer
from services.reward.math_scorer import MathScorer
from services.reward.model_scorer import ModelScorer
from services.reward.rg_scorer import ReasoningGymScorer

SCORERS: dict[str, type[Scorer]] = {
    MathScorer.kind: MathScorer,
    CodeScorer.kind: CodeScorer,
    ModelScorer.kind: ModelScorer,
    JudgeScorer.kind: JudgeScorer,
    ReasoningGymScorer.kind: ReasoningGymScorer,
}
