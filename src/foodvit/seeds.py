"""One run seed, one independent random stream per purpose.

Each purpose (model initialisation, the validation split, the order of the photos, their
augmentation, the rest of a training step: dropout, stochastic depth, mixup, the localization
loss's pairs; the training subset of --train-fraction) draws from its own seed, hashed from
(run seed, purpose, epoch, ...). So changing how one of them draws (a new augmentation op,
another split) leaves the others as they were, and no two purposes ever start from the same state.
"""

from __future__ import annotations

import hashlib

PURPOSES = (
    "init",
    "validation",
    "order",
    "augment",
    "step",
    "subset",
    "teacher-init",
    "teacher-step",
    "pretrain-init",
    "pretrain-step",
)


def derive_seed(seed: int, purpose: str, *keys: int) -> int:
    """A 63-bit seed for `purpose` (one of PURPOSES), further keyed by e.g. the epoch."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown seed purpose {purpose!r}; expected one of {', '.join(PURPOSES)}")
    digest = hashlib.blake2b(repr((int(seed), purpose, *map(int, keys))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
