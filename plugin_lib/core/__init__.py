"""The Plugin itself, independent of any dataset or experiment.

- ``blackbox``: ``BlackBoxLM`` (the closed model's interface) and its top-k log-probability view.
- ``reweighter``: the small reweighting models.
- ``combine`` / ``loss``: p_t ∝ b_t · r_t in log space, and token cross-entropy on it.
- ``train``: encoding, the base-output cache, the training loop.
- ``decode``: ``PluginLogitsProcessor`` for transformers' ``generate``, and ``generate``.

Imports only torch, transformers, numpy, tqdm, httpx (``api``) and ``core`` itself.
"""
