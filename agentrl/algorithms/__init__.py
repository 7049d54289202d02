"""GRPO-family RL math as pure functions of tensors.

Advantages (:func:`group_advantages`, REINFORCE++, GAE), per-token policy losses
(:func:`ppo_clip_loss`, :func:`gspo_loss`, :func:`cispo_loss`), KL estimators (:func:`kl`),
train/inference mismatch weights (:func:`tis_weights`, :func:`mis_weights`), the packing-invariant
reducer (:func:`reduce_loss`) and chunked log-probs/entropy from logits. No module here holds
state, touches a model, or talks to another process; the formulas follow the RL-math reference.
"""

import lazy_loader

# The names are listed in __init__.pyi; each submodule is imported on first use, so importing a
# config module does not pull in torch or Ray.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
