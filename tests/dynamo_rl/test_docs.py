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
        "| `n_min`, `n_max` | 2, 25 | bounds |\n"
    )
    rows = documented_defaults(page)
    assert [(k, d) for k, d, _ in rows] == [("allocator.n_min", "2"), ("allocator.n_max", "25")]
    assert agrees("2", schema_default("allocator.n_min"))
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


# pyproject.toml names paths too, in values (pytest's testpaths, ruff's excludes, the packages
# whose data ships) and in comments saying which test or script a dependency is for: each must
# exist, so a moved test does not leave its name behind there either.
_BARE_PATH = re.compile(
    rf"(?<![\w./-])((?:{_FOLDERS}|scripts|tests|docs|proto|vllm_plugin)/[A-Za-z0-9_./-]*)"
)


def pyproject_paths(text: str) -> list[str]:
    """Every repository path ``text`` (a pyproject.toml) names: the folder-rooted paths anywhere
    in it, pytest's ``testpaths``, and the packages of ``tool.setuptools.package-data``."""
    import tomllib

    tool = tomllib.loads(text).get("tool", {})
    found = [m.group(1).rstrip(".") for m in _BARE_PATH.finditer(text)]
    found += tool.get("pytest", {}).get("ini_options", {}).get("testpaths", [])
    found += [
        pkg.replace(".", "/")
        for pkg in tool.get("setuptools", {}).get("package-data", {})
        if pkg != "*"
    ]
    return found


def test_the_pyproject_path_finder_reads_values_comments_and_testpaths() -> None:
    text = (
        '[project.optional-dependencies]\ndev = ["x>=1",  # tests/a/test_b.py: why\n]\n'
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
        '[tool.ruff]\nextend-exclude = ["dynamo_rl/proto", ".venv-vllm"]\n'
        '[tool.setuptools.package-data]\n"*" = ["*.json"]\n"dashboard.static" = ["*.js"]\n'
        "# not a path: x/tests/y, dynamo_rl.cli\n"
    )
    assert sorted(pyproject_paths(text)) == sorted(
        ["tests/a/test_b.py", "dynamo_rl/proto", "tests", "dashboard/static"]
    )


def test_every_path_pyproject_names_exists() -> None:
    names = pyproject_paths((REPO / "pyproject.toml").read_text())
    assert "tests" in names and any(n.startswith("tests/") for n in names)
    missing = [n for n in names if not (REPO / n).exists()]
    assert not missing, f"pyproject.toml names paths that do not exist: {missing}"


# The layout the docs draw names the module that holds each responsibility by its bare file name
# under a folder (README's layout table; docs/architecture.md's "The code, folder by folder"), so
# the check above, which reads whole paths, does not see them: a renamed module must take its
# name in the map with it.
_MODULE = re.compile(r"(?<![\w/.*])([a-z0-9_]+\.py|[a-z0-9_*]+\*)(?![\w/])")
_FOLDER = re.compile(r"(?<![\w/.])([a-z0-9_]+/)(?=\s*(?:\(|·|$))")


def layout_names(lines: list[str]) -> list[tuple[str, str]]:
    """(folder, bare name) for every module and sub-folder a folder-by-folder code block names.

    A line that starts with ``name/`` opens that folder (relative to the nearest less-indented
    folder above it); a line that starts with a file name belongs to the nearest less-indented
    folder above it; a continuation line (no name of its own at its start) belongs with the line
    before it."""
    out: list[tuple[str, str]] = []
    folders: list[tuple[int, str]] = []  # (indent, path) of the open folders
    context = ""
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        head = line.split()[0]
        named = bool(re.fullmatch(r"[a-z0-9_/]+/|[a-z0-9_.*]+\.py", head))
        if named and indent < 8:
            while folders and folders[-1][0] >= indent:
                folders.pop()
            parent = folders[-1][1] if folders else ""
            if head.endswith("/"):
                context = parent + head
                folders.append((indent, context))
                rest = line.lstrip()[len(head) :]
            else:
                context, rest = parent, line
        else:
            rest = line
        out += [(context, m.group(1)) for m in _MODULE.finditer(rest)]
        out += [(context, m.group(1)) for m in _FOLDER.finditer(rest)]
    return out


def _architecture_block() -> list[str]:
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## The code, folder by folder", 1)[1]
    return section.split("```", 2)[1].splitlines()


def _readme_layout() -> list[tuple[str, str]]:
    out = []
    for line in (REPO / "README.md").read_text().splitlines():
        cells = _cells(line) if line.startswith("| `") else []
        folder = re.fullmatch(r"`([a-z_/]+/)`", cells[0]) if cells else None
        if folder is None:
            continue
        for cell in cells[1:]:
            for name in re.findall(r"`([a-z0-9_/]+(?:\.py|/))`", cell):
                # Relative to the row's folder, unless written from the repository's top.
                top = name.startswith(folder.group(1))
                out.append(("", name) if top else (folder.group(1), name))
    return out


def _missing(pairs: list[tuple[str, str]]) -> list[str]:
    return [
        folder + name
        for folder, name in pairs
        if not (list(REPO.glob(folder + name)) if "*" in name else (REPO / folder / name).exists())
    ]


def test_the_layout_reader_places_names_in_their_folders() -> None:
    block = [
        "dynamo_rl/            shared (every process)",
        "  config/               the config",
        "  contracts/            one module per contract:",
        "    stream.py             the stream (weight_layout.py: buckets)",
        "  codec.py keys.py",
        "services/engine/      engine.py (the Engine) · sampler.py · math_* scorers ·",
        "                      kv_cache.py (merge) · model/judge scorers · static/",
    ]
    assert layout_names(block) == [
        ("dynamo_rl/contracts/", "stream.py"), ("dynamo_rl/contracts/", "weight_layout.py"),
        ("dynamo_rl/", "codec.py"), ("dynamo_rl/", "keys.py"),
        ("services/engine/", "engine.py"), ("services/engine/", "sampler.py"),
        ("services/engine/", "math_*"), ("services/engine/", "kv_cache.py"),
        ("services/engine/", "static/"),
    ]  # fmt: skip


def test_every_module_the_layout_names_exists() -> None:
    names = layout_names(_architecture_block()) + _readme_layout()
    assert len(names) > 60, names  # the reader found the map
    missing = _missing(names)
    assert not missing, (
        f"named in the layout (README.md, docs/architecture.md), not in the tree: {missing}"
    )


MAX_LINES = 600
"""The most lines a source file outside ``benchmarks/`` (and generated code) may have."""


def test_no_source_file_outside_benchmarks_is_over_600_lines() -> None:
    """A file that grows past this holds several things; split it by what it holds. The tracked
    Python files, generated protobuf code aside."""
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked, "git ls-files found no Python file"
    long = {}
    for rel in tracked:
        parts = Path(rel).parts
        if parts[0] == "benchmarks" or parts[:2] == ("dynamo_rl", "proto"):
            continue
        n = len((REPO / rel).read_text().splitlines())
        if n > MAX_LINES:
            long[rel] = n
    assert not long, f"over {MAX_LINES} lines: {long}"
