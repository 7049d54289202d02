"""Package discovery for the agentrl namespace.

``tools/``, ``environments/`` and ``templates/`` are top-level folders of the repository that
install as ``agentrl.tools``, ``agentrl.environments`` and ``agentrl.templates``. Their subpackages
are found here so that adding one needs no edit to ``pyproject.toml``.
"""

from setuptools import find_packages, setup

_MAPPED = {"agentrl": "agentrl", "agentrl.tools": "tools", "agentrl.environments": "environments",
           "agentrl.templates": "templates"}


def _packages() -> list[str]:
    found: list[str] = []
    for name, folder in _MAPPED.items():
        found.append(name)
        found.extend(f"{name}.{sub}" for sub in find_packages(where=folder))
    return sorted(set(found))


setup(packages=_packages())
