"""A verifiers single-turn environment over local rows, written in the library's own API (the
shape of a published environment module: ``load_environment(**args)``).

``reward``: ``length`` scores a completion by its text's length (so a test can recompute it from
the sampled ids); ``none`` returns no number; ``raise`` raises in the rubric.
"""

import verifiers as vf
from datasets import Dataset


def load_environment(n: int = 2, reward: str = "length") -> vf.Environment:
    rows = [{"question": f"What is {i}+1?", "answer": str(i + 1)} for i in range(n)]

    def text_length(completion, **kwargs) -> float:
        if reward == "raise":
            raise RuntimeError("rubric broke")
        if reward == "none":
            return None  # type: ignore[return-value]
        return float(len(completion[-1]["content"] or ""))

    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        system_prompt="Answer briefly.",
        rubric=vf.Rubric(funcs=[text_length], weights=[1.0]),
    )
