"""The package layout promised by the design: tools/, environments/ and templates/ install into agentrl."""

import importlib
import importlib.resources


def test_mapped_subpackages_import() -> None:
    tools = importlib.import_module("agentrl.tools")
    envs = importlib.import_module("agentrl.environments")
    assert tools.__file__ is not None and tools.__file__.endswith("__init__.py")
    assert envs.__file__ is not None and envs.__file__.endswith("__init__.py")


def test_templates_ship_as_package_data() -> None:
    files = {p.name for p in importlib.resources.files("agentrl.templates").iterdir()}
    assert {"qwen3.jinja", "qwen3_5.jinja", "qwen3_coder.jinja"} <= files
