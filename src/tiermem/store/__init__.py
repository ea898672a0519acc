"""Storage: the contract, key rules, and the backends that implement them."""

from tiermem.store.contract import (
    Capability,
    DurableStore,
    HotAppendResult,
    HotStore,
)

__all__ = ["Capability", "DurableStore", "HotAppendResult", "HotStore"]
