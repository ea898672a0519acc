"""Storage backends. Each implements both roles of :mod:`tiermem.store.contract`.

Only :mod:`~tiermem.store.backends.memory` and :mod:`~tiermem.store.backends.sqlite` are
importable without optional extras; ``redis`` and ``dynamodb`` need their extras.
"""
