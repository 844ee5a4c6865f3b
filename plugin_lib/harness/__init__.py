"""Running experiments: the ``Profile`` (profiles.yaml), base models by name, the paper's
methods and baselines, the resumable runner and run store, fine-tuning, LoRA, BDPL and FLOPs."""
from .profile import Profile, load_profile

__all__ = ["Profile", "load_profile"]
