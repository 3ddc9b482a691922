"""One definition of each shared concept: the representations, the id scheme, the success rule."""

from __future__ import annotations

import forge.learn.reflect
import forge.protocols
import forge.protocols.config


def test_the_representations_are_defined_once_in_learn() -> None:
    assert forge.protocols.config.REPRESENTATIONS is forge.learn.reflect.REPRESENTATIONS
    assert forge.protocols.REPRESENTATIONS is forge.learn.reflect.REPRESENTATIONS
