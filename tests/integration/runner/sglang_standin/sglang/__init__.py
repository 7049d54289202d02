"""A recording stand-in for SGLang, on the ``PYTHONPATH`` of engine processes in placement tests only."""
