"""plugin_lib: the Plugin method of "Logits are All We Need to Adapt Closed Models" and
everything needed to reproduce the paper's experiments."""

__version__ = "0.1.0"
