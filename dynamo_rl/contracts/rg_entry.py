"""reasoning-gym entries on the wire: the pinned version's tasks and the entry's JSON form.

A reasoning-gym entry is ``{"question", "answer", "metadata"}``; the library's
``score_answer(answer, entry)`` reads the whole of it back, metadata included, and some tasks
compare what it holds by type (``arc_agi`` and ``rearc`` keep grids as tuples of tuples: as
JSON lists, their own answers score 0.05 instead of 1). So an entry travels in a typed JSON
form (:func:`encode_entry`, :func:`decode_entry`) that gives back what the generator made:

- tuples as ``{"__tuple__": [...]}``, sets as ``{"__set__": [...]}``;
- a dict with a key that is not a string (``graph_color``'s colourings, keyed by int), or whose
  only key is one of these tags, as ``{"__dict__": [[key, value], ...]}``;
- floats that JSON cannot hold (``nan``, ``inf``) as ``{"__float__": "nan"}``;
- numpy scalars as the Python number they hold; anything else (an array, an object) is refused,
  naming where it is, rather than guessed.

``dynamo-rl data reasoning-gym`` writes rows in this form (``tasks/reasoning_gym_data.py``), the
reward service's workers score with the decoded entry (``services/reward/rg_answer.py``), and
both take the task from the row's ``data_source``, ``reasoning_gym/<task>``.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "PREFIX",
    "TASKS",
    "VERSION",
    "decode_entry",
    "encode_entry",
    "source_form",
    "task_of",
]

VERSION = "0.1.25"
"""The reasoning-gym version pinned in pyproject.toml, whose tasks :data:`TASKS` lists."""

PREFIX = "reasoning_gym/"
"""A row's ``data_source`` is ``reasoning_gym/<task>``."""

# Every dataset reasoning-gym 0.1.25 registers, but "composite": that one mixes the others
# (dynamo-rl data reasoning-gym --tasks a,b --weights 1,2), and its entries name their own task.
# tests/tasks/test_reasoning_gym.py holds this list to the installed library's registry.
TASKS: tuple[str, ...] = (
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion",
    "basic_arithmetic", "bf", "binary_alternation", "binary_matrix", "bitwise_arithmetic",
    "boxnet", "caesar_cipher", "calendar_arithmetic", "chain_sum", "circuit_logic", "codeio",
    "coin_flip", "color_cube_rotation", "complex_arithmetic", "count_bits", "count_primes",
    "countdown", "course_schedule", "cryptarithm", "decimal_arithmetic", "decimal_chain_sum",
    "dice", "emoji_mystery", "family_relationships", "figlet_font", "fraction_simplification",
    "futoshiki", "game_of_life", "game_of_life_halting", "gcd", "graph_color", "group_anagrams",
    "gsm_symbolic", "intermediate_integration", "isomorphic_strings", "jugs", "kakurasu",
    "knight_swap", "knights_knaves", "largest_island", "lcm", "leg_counting", "letter_counting",
    "letter_jumble", "list_functions", "mahjong_puzzle", "manipulate_matrix", "maze",
    "mini_sudoku", "modulo_grid", "n_queens", "needle_haystack", "number_filtering",
    "number_format", "number_sequence", "number_sorting", "palindrome_generation",
    "palindrome_partitioning", "path_star", "polynomial_equations", "polynomial_multiplication",
    "pool_matrix", "power_function", "prime_factorization", "products", "propositional_logic",
    "puzzle24", "quantum_lock", "ransom_note", "rearc", "rectangle_count", "rotate_matrix",
    "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference", "sentence_reordering",
    "shortest_path", "simple_equations", "simple_geometry", "simple_integration", "sokoban",
    "spell_backward", "spiral_matrix", "string_insertion", "string_manipulation",
    "string_splitting", "string_synthesis", "sudoku", "survo", "syllogism", "time_intervals",
    "tower_of_hanoi", "tsumego", "word_ladder", "word_sequence_reversal", "word_sorting",
    "zebra_puzzles",
)  # fmt: skip
_KNOWN = frozenset(TASKS)


def task_of(data_source: str | None) -> str | None:
    """The task of a ``reasoning_gym/<task>`` data source, when ``<task>`` is one of
    :data:`TASKS`; else None."""
    if not data_source or not data_source.startswith(PREFIX):
        return None
    task = data_source[len(PREFIX) :]
    return task if task in _KNOWN else None


def source_form() -> str:
    """The allowed form of a reasoning-gym data source, for error messages."""
    return f"{PREFIX}<task>, <task> one of reasoning-gym {VERSION}'s: {', '.join(TASKS)}"


TUPLE, SET, DICT, FLOAT = "__tuple__", "__set__", "__dict__", "__float__"
_TAGS = (TUPLE, SET, DICT, FLOAT)


def encode_entry(value: Any, where: str = "entry") -> Any:
    """``value`` (an entry, or any part of one) in the typed JSON form; TypeError naming the
    path of a value that has none."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {FLOAT: repr(float(value))}
    if isinstance(value, tuple):
        return {TUPLE: [encode_entry(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode_entry(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return {SET: [encode_entry(v, f"{where}{{}}") for v in value]}
    if isinstance(value, dict):
        plain = all(isinstance(k, str) for k in value)
        if plain and not (len(value) == 1 and next(iter(value)) in _TAGS):
            return {k: encode_entry(v, f"{where}.{k}") for k, v in value.items()}
        return {DICT: [[encode_entry(k, f"{where} key"), encode_entry(v, f"{where}.{k}")]
                       for k, v in value.items()]}  # fmt: skip
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return encode_entry(value.item(), where)  # a numpy scalar: the number it holds
    raise TypeError(f"{where}: a {type(value).__name__} has no JSON form here")


def decode_entry(value: Any, where: str = "entry") -> Any:
    """The value :func:`encode_entry` encoded; ValueError naming the path of a malformed part."""
    if isinstance(value, list):
        return [decode_entry(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        tag, body = next(iter(value.items()))
        if tag in (TUPLE, SET, DICT) and not isinstance(body, list):
            raise ValueError(f"{where}.{tag}: expected a list")
        if tag == TUPLE:
            return tuple(decode_entry(v, f"{where}[{i}]") for i, v in enumerate(body))
        if tag == SET:
            try:
                return {decode_entry(v, f"{where}{{}}") for v in body}
            except TypeError as e:
                raise ValueError(f"{where}.{SET}: {e}") from None
        if tag == DICT:
            out: dict[Any, Any] = {}
            for i, pair in enumerate(body):
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise ValueError(f"{where}.{DICT}[{i}]: expected a [key, value] pair")
                key = decode_entry(pair[0], f"{where}.{DICT}[{i}]")
                try:
                    out[key] = decode_entry(pair[1], f"{where}.{key}")
                except TypeError as e:
                    raise ValueError(f"{where}.{DICT}[{i}]: {e}") from None
            return out
        if tag == FLOAT:
            if body not in ("nan", "inf", "-inf"):
                raise ValueError(f"{where}.{FLOAT}: expected 'nan', 'inf' or '-inf'")
            return float(body)
    return {k: decode_entry(v, f"{where}.{k}") for k, v in value.items()}
