"""The model classes a CPU engine registers up front (``SGLANG_EXTERNAL_MODEL_PACKAGE``).

SGLang imports every one of its ~200 model files when its scheduler starts (~3 s on a small CPU
machine) unless an external model package is named; then it registers that package's classes and
imports its own only when a model's architecture is not among them. Each module here re-exports one
of SGLang's own classes as ``EntryClass``; any other architecture still loads, just without the
shortcut.
"""
