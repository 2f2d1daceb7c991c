from __future__ import annotations

import pytest

from dynamo_rl.prompts import render_prompt, render_raw


class CharTokenizer:
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="}]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("plain", "System: Be brief.\nUser: 2+2=\nAssistant:"),
        ("auto", "System: Be brief.\nUser: 2+2=\nAssistant:"),
        ("raw", "Be brief.\n2+2="),
    ],
)
def test_templates(template: str, expected: str) -> None:
    text, ids = render_prompt(CharTokenizer(), MESSAGES, template)
    assert text == expected and ids == [ord(c) for c in expected]


def test_text_prompts_are_verbatim_and_bad_templates_refused() -> None:
    assert render_prompt(CharTokenizer(), "1+1=", "plain")[0] == "1+1="
    with pytest.raises(ValueError, match="no chat template"):
        render_prompt(CharTokenizer(), MESSAGES, "chat")
    with pytest.raises(ValueError, match="one of auto, chat, plain, raw"):
        render_prompt(CharTokenizer(), MESSAGES, "fancy")


def test_raw_conversations_write_a_model_turn_where_generation_continued() -> None:
    # One rendering for the rollout's episodes and the tool recipe's demonstrations (tasks/).
    messages = [
        {"role": "user", "content": "12*34="},
        {"role": "assistant", "content": "<call>"},
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "408"},
    ]
    assert render_raw(messages[:1]) == "12*34="
    assert render_raw(messages) == "12*34=<call>\n408408"
    assert (
        render_raw([{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}])
        == "a\nb"
    )
