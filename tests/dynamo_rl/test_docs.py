"""The docs say what the code does: documented config defaults equal the schema's, and no page points
outside the repository.

Config is documented in Markdown tables with a ``key`` and a ``default`` column. A key is either
absolute (``engine.port``) or relative to the section the table is introduced by: the first
backticked name in the nearest line above the table (``## Configuration (`allocator` section)``,
```up.restart` (in …)``). A cell may list several keys (```n_min`, `n_max``` with ``4, 24``) and
``sampling.{a,b}`` expands to ``sampling.a``, ``sampling.b``. A default written as a literal (a
number, ``true``, ``[]``, a name) must equal the schema's; one written as prose ("engine.model",
"first of `/v1/models`") stands for a default computed at run time, so the schema's must be unset.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynamo_rl.config import ExperimentConfig

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
NONE = {"—", "-", "none", "null", "— (required)"}


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _split(cell: str) -> list[str]:
    return [p.strip() for p in re.split(r",\s+(?![^{]*})", cell) if p.strip()]


def _expand(key: str) -> list[str]:
    key = key.strip("`").rstrip(":")
    m = re.fullmatch(r"(.*)\.\{(.+)\}", key)
    return [f"{m.group(1)}.{part}" for part in m.group(2).split(",")] if m else [key]


def documented_defaults(path: Path) -> list[tuple[str, str, int]]:
    """(dotted key, documented default, line number) of every config table in ``path``."""
    lines = path.read_text().splitlines()
    sections = set(ExperimentConfig.model_fields)
    found: list[tuple[str, str, int]] = []
    i = 0
    while i < len(lines):
        header = _cells(lines[i]) if lines[i].startswith("|") else []
        if "key" not in header or "default" not in header:
            i += 1
            continue
        above = next((x for x in reversed(lines[:i]) if x.strip()), "")
        names = re.findall(r"`([a-z_.]+):?`", above)
        prefix = names[0] if names else ""
        k, d = header.index("key"), header.index("default")
        i += 2  # the header and its --- line
        while i < len(lines) and lines[i].startswith("|"):
            row = _cells(lines[i])
            keys = [x for part in _split(row[k]) for x in _expand(part)]
            defaults = _split(row[d])
            if len(defaults) != len(keys):
                defaults = [row[d]] * len(keys) if len(keys) == 1 else defaults
            assert len(defaults) == len(keys), (
                f"{path.name}:{i + 1}: {len(keys)} keys, defaults {defaults}"
            )
            for key, default in zip(keys, defaults, strict=True):
                absolute = key.split(".")[0] in sections
                found.append((key if absolute or not prefix else f"{prefix}.{key}", default, i + 1))
            i += 1
    return found


def schema_default(dotted: str) -> Any:
    node: Any = ExperimentConfig()
    for part in dotted.split("."):
        assert hasattr(node, part), f"{dotted}: no such config key"
        node = getattr(node, part)
    return node


def agrees(doc: str, default: Any) -> bool:
    text = doc.strip().strip("`").replace("−", "-")
    if text in NONE:
        return default is None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    if isinstance(default, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(default)
    if isinstance(default, tuple):  # a dataclass section's list (rollout.sampling.stop)
        default = list(default)
    if isinstance(default, (list, dict)):
        return value == default
    if isinstance(default, str):
        return str(value) == default
    if default is None:  # computed at run time: the doc says from what, in words
        return isinstance(value, str) and not re.fullmatch(r"[\d.eE+-]+", value)
    return False


TABLES = [(p.name, *row) for p in DOCS for row in documented_defaults(p)]


def test_the_docs_document_config_defaults_in_tables() -> None:
    pages = {page for page, *_ in TABLES}
    assert {"allocator.md", "rollout.md", "engine.md", "reliability.md"} <= pages, pages
    assert len(TABLES) > 60


@pytest.mark.parametrize(
    ("page", "key", "doc", "line"), TABLES, ids=[f"{t[0]}:{t[1]}" for t in TABLES]
)
def test_documented_default_is_the_schemas(page: str, key: str, doc: str, line: int) -> None:
    default = schema_default(key)
    if hasattr(default, "get_secret_value"):
        default = default.get_secret_value()
    assert agrees(doc, default), (
        f"docs/{page}:{line}: {key} documented as {doc!r}, schema {default!r}"
    )


@pytest.mark.parametrize("section", ["allocator", "rollout", "engine", "up.restart"])
def test_every_field_of_a_documented_section_is_in_its_table(section: str) -> None:
    documented = {key for _page, key, _doc, _line in TABLES}
    node: Any = ExperimentConfig()
    for part in section.split("."):
        node = getattr(node, part)
    missing = []
    for name in type(node).model_fields:
        value = getattr(node, name)
        subs = type(value).model_fields if hasattr(type(value), "model_fields") else None
        if dataclasses.is_dataclass(value):  # a dataclass section (rollout.sampling)
            subs = [f.name for f in dataclasses.fields(value)]
        keys = [f"{section}.{name}.{sub}" for sub in subs] if subs else [f"{section}.{name}"]
        missing += [k for k in keys if k not in documented]
    assert not missing, f"in the schema, not in the docs' tables: {missing}"


def test_the_parser_catches_a_wrong_default(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    page.write_text(
        "## Configuration (`allocator` section)\n\n| key | default | meaning |\n| --- | --- | --- |\n"
        "| `n_min`, `n_max` | 4, 25 | bounds |\n"
    )
    rows = documented_defaults(page)
    assert [(k, d) for k, d, _ in rows] == [("allocator.n_min", "4"), ("allocator.n_max", "25")]
    assert agrees("4", schema_default("allocator.n_min"))
    assert not agrees("25", schema_default("allocator.n_max"))


def test_no_page_points_outside_the_repository() -> None:
    pages = [REPO / "README.md", *DOCS]
    for page in pages:
        text = page.read_text()
        for phrase in ("../shared", "DESIGN.md", "design page", "the issue"):
            assert phrase not in text, f"{page.name} mentions {phrase!r}"


# A path the docs name in backticks under one of the repository's folders must exist, so a moved or
# renamed module cannot leave the pages behind. The one exception is an example of a file a user
# would write (docs/reward.md, adding a scorer).
_FOLDERS = "dynamo_rl|allocator|services|learner|launcher|dashboard|tasks|configs|deploy|benchmarks"
_PATH = re.compile(rf"`((?:{_FOLDERS}|scripts|tests|docs|proto|vllm_plugin)/[A-Za-z0-9_./-]*)`")
_EXAMPLES = {"services/reward/toxicity_scorer.py"}


def named_paths(text: str) -> list[str]:
    return [m.group(1).rstrip(".") for m in _PATH.finditer(text)]


def test_the_path_finder_reads_backticked_repository_paths() -> None:
    text = "see `launcher/up.py`, `services/rollout/` and `dynamo-rl up`; not `a/b.py`."
    assert named_paths(text) == ["launcher/up.py", "services/rollout/"]


def test_every_path_the_docs_name_exists() -> None:
    missing = [
        f"{page.name}:{i}: {path}"
        for page in [REPO / "README.md", *DOCS]
        for i, line in enumerate(page.read_text().splitlines(), 1)
        for path in named_paths(line)
        if path not in _EXAMPLES and not (REPO / path).exists()
    ]
    assert not missing, "\n".join(missing)
