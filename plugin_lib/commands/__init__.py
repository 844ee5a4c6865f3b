"""Commands that compose the layers: the top layer, above the experiments (docs/architecture.md).

``plugin-repro`` (``plugin_lib/__main__.py``) starts them; nothing below imports them.
"""
