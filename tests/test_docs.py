"""The docs stay true: the README's two commands, every config option in the README, every
method's settings and defaults in docs/algorithms.md."""

from __future__ import annotations

import re

from conftest import REPO

README = (REPO / "README.md").read_text()


def first_code_block() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_readme_opens_with_setup_then_main_job_then_setup_then_tests():
    main_job, tests = first_code_block()
    assert main_job == "bash scripts/setup.sh && .venv/bin/driftfl run"
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == tests  # CI runs exactly the README's test command


def test_every_config_option_is_in_the_readme():
    for group in ("strategy", "aggregation", "selection", "dataset", "partition", "model"):
        for option in (REPO / "conf" / group).glob("*.yaml"):
            assert f"`{option.stem}`" in README, f"{group}={option.stem} is not documented"


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
