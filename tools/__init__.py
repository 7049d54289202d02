"""Tools the model can call, and the sandboxes that run code tools (installed as ``agentrl.tools``)."""

__all__: list[str] = []
