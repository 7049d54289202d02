"""Environments: the Environment base class and ready environments (installed as ``agentrl.environments``)."""

__all__: list[str] = []
