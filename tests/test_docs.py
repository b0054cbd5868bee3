"""The docs stay true: the README's two commands, a front page, every method in the README,
every config option in docs/running.md, every method's settings and defaults in
docs/algorithms.md, the guides' code complete and the model guide's example working."""

from __future__ import annotations

import ast
import builtins
import importlib
import math
import re
import symtable

import pytest
import torch
import yaml
from conftest import REPO
from test_models import user_models  # noqa: F401  (a fixture)

from driftfl.common.errors import ConfigError
from driftfl.common.models import build_model, registered_models
from driftfl.common.training import CrossEntropy, TrainSettings, train_locally

README = (REPO / "README.md").read_text()
RUNNING = (REPO / "docs" / "running.md").read_text()


def first_code_block() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_readme_opens_with_setup_then_main_job_then_setup_then_tests():
    main_job, tests = first_code_block()
    assert main_job == "bash scripts/setup.sh && .venv/bin/driftfl run"
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == tests  # CI runs exactly the README's test command


def test_every_method_is_in_the_readme_and_every_config_option_in_running_md():
    for option in (REPO / "conf" / "strategy").glob("*.yaml"):
        assert f"| `{option.stem}` |" in README, f"strategy={option.stem} is not in the README"
    for group in ("aggregation", "selection", "dataset", "partition", "model"):
        for option in (REPO / "conf" / group).glob("*.yaml"):
            assert f"`{option.stem}`" in RUNNING, f"{group}={option.stem} is not documented"


def test_the_readme_is_a_front_page_and_its_links_lead_somewhere():
    assert len(README.splitlines()) < 250
    for link in re.findall(r"\]\((?!https?:)([^)#]+)[^)]*\)", README):
        assert (REPO / link).exists(), link
    assert "FAST_TIER" not in README and "FULL_SUITE" not in README


@pytest.mark.parametrize("page", sorted(p.name for p in (REPO / "docs").glob("*.md")))
def test_every_link_in_the_docs_leads_somewhere(page):
    """The docs link the kept runs in the top-level results/ (../results/...), and each
    other: a moved folder or page shows here."""
    for link in re.findall(r"\]\((?!https?:)([^)#]+)[^)]*\)", (REPO / "docs" / page).read_text()):
        assert (REPO / "docs" / link).resolve().exists(), f"{page}: {link}"


def _shown(value) -> str:
    """A default as the docs' tables write it."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_algorithms_md_lists_every_methods_settings_with_their_defaults():
    from driftfl.methods import METHODS, method_schema

    algorithms = (REPO / "docs" / "algorithms.md").read_text()
    sections = re.split(r"\n### ", algorithms)
    for name, method in METHODS.items():
        section = next((s for s in sections if f"`strategy={name}`" in s.splitlines()[0]), None)
        assert section, f"docs/algorithms.md has no section for strategy={name}"
        fields = method_schema(name, method.objective).model_fields
        rows = re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", section, re.M)
        settings = {k: f.get_default() for k, f in fields.items() if k not in ("name", "objective")}
        assert {key for key, _ in rows} == set(settings), name
        for key, shown in rows:
            assert shown.split(" (")[0] == _shown(settings[key]), (name, key, shown)


# --- the guides' code: complete, and the model example runs ------------------------------------

GUIDES = ("adding-a-method.md", "adding-a-model.md")


def code_blocks(guide: str, language: str = "python") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (REPO / "docs" / guide).read_text(), re.S)


def undefined_names(source: str) -> set[str]:
    """Names the code reads that it neither defines nor imports (nor are builtins)."""
    top = symtable.symtable(source, "snippet", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()

    def visit(table):
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (table is top or symbol.is_global()):
                read.add(symbol.get_name())
        for child in table.get_children():
            visit(child)
    visit(top)
    return read - defined - set(dir(builtins))


@pytest.mark.parametrize("guide", GUIDES)
def test_every_snippet_in_the_guides_is_complete(guide):
    """A snippet is a module that runs as shown: its imports import and it uses no name it does
    not define or import. An excerpt says where it sits (``# in <file>, ...``) and is there."""
    for block in code_blocks(guide):
        excerpt = re.match(r"# in ([\w/.]+)", block)
        if excerpt:
            source = (REPO / excerpt.group(1)).read_text()
            assert all(line.strip() in source for line in block.splitlines()[1:]), block
            continue
        assert not undefined_names(block), (guide, undefined_names(block), block[:200])
        imports = [node for node in ast.parse(block).body
                   if isinstance(node, (ast.Import, ast.ImportFrom))]
        exec(compile(ast.Module(imports, type_ignores=[]), guide, "exec"), {})


def test_an_incomplete_snippet_is_found():
    assert undefined_names("class A(Settings):\n    x: int = Field(1)\n") == {"Settings", "Field"}
    assert undefined_names("import torch\ndef f(x):\n    return torch.relu(x) + y\n") == {"y"}


def test_the_torchvision_model_example_registers_builds_and_trains_one_step(user_models):
    (module,) = code_blocks("adding-a-model.md")
    (user_models / "mobilenet.py").write_text(module)
    importlib.invalidate_caches()
    model = build_model({"name": "mobilenet_v3_small", "width_mult": 0.5}, (1, 28, 28), 10)
    x, y = torch.randn(4, 1, 28, 28), torch.arange(4)
    before = model.head.weight.detach().clone()
    stats = train_locally(model, x, y, TrainSettings(1, 4, 0.05, 0.9, 0.0), CrossEntropy(),
                          torch.Generator().manual_seed(0))
    assert stats.steps == 1 and math.isfinite(stats.mean_loss)
    assert not torch.equal(before, model.head.weight)
    # its yaml holds the schema's defaults, as every conf/model/ yaml does
    (yaml_block,) = code_blocks("adding-a-model.md", "yaml")
    schema = registered_models()["mobilenet_v3_small"][0]
    assert yaml.safe_load(yaml_block) == schema(name="mobilenet_v3_small").model_dump()
    with pytest.raises(ConfigError, match=r"^model.width_mult must be > 0, got 0$"):
        build_model({"name": "mobilenet_v3_small", "width_mult": 0}, (1, 28, 28), 10)
