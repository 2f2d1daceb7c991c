"""A verifiers multi-turn environment over local rows, in the library's own API: after each model
turn the environment answers with a user message, until ``max_turns`` model turns.

``fail_at``: the environment's turn that raises (0: none), to check that a failing protocol drops
its episode.
"""

import verifiers as vf
from datasets import Dataset


class Nudge(vf.MultiTurnEnv):
    def __init__(self, fail_at: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.fail_at = fail_at

    async def env_response(self, messages, state, **kwargs):
        k = len(state["trajectory"])
        if k == self.fail_at:
            raise RuntimeError(f"environment broke at turn {k}")
        return [vf.UserMessage(content=f"Turn {k} seen. Again?")]


def load_environment(n: int = 2, max_turns: int = 3, fail_at: int = 0) -> vf.Environment:
    rows = [{"question": f"Count to {i + 2}.", "answer": str(i + 2)} for i in range(n)]

    def turns(state, **kwargs) -> float:
        return float(len(state["trajectory"]))

    return Nudge(
        dataset=Dataset.from_list(rows),
        system_prompt="Answer briefly.",
        rubric=vf.Rubric(funcs=[turns], weights=[1.0]),
        max_turns=max_turns,
        fail_at=fail_at,
    )
