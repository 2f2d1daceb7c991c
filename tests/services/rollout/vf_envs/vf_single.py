"""A verifiers single-turn environment over local rows, written in the library's own API (the
shape of a published environment module: ``load_environment(**args)``).

``reward``: ``length`` scores a completion by its text's length (so a test can recompute it from
the sampled ids); ``none`` returns no number; ``raise`` raises in the rubric. ``eval_n``: rows of
an ``eval_dataset`` (questions the training rows do not ask; 0: none).
"""

import verifiers as vf
from datasets import Dataset


def load_environment(n: int = 2, reward: str = "length", eval_n: int = 0) -> vf.Environment:
    rows = [{"question": f"What is {i}+1?", "answer": str(i + 1)} for i in range(n)]
    held_out = [{"question": f"What is {i}+2?", "answer": str(i + 2)} for i in range(eval_n)]

    def text_length(completion, **kwargs) -> float:
        if reward == "raise":
            raise RuntimeError("rubric broke")
        if reward == "none":
            return None  # type: ignore[return-value]
        return float(len(completion[-1]["content"] or ""))

    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(held_out) if held_out else None,
        system_prompt="Answer briefly.",
        rubric=vf.Rubric(funcs=[text_length], weights=[1.0]),
    )
