"""The README stays true: its two commands, and every config option it offers exists."""

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
    for group in ("strategy", "dataset", "partition", "model"):
        for option in (REPO / "conf" / group).glob("*.yaml"):
            assert f"`{option.stem}`" in README, f"{group}={option.stem} is not documented"
