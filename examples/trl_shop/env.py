"""A stock room: check an item's stock, then reserve units of it. Written as TRL's docs
write environment classes: no constructor arguments, `reset(**kwargs)` gets the dataset
row's columns, every public method with type hints and a Google-style docstring is a tool,
and the reward function reads the instances' state after the episode.
"""

from __future__ import annotations

STOCK = {"A-17": 40, "B-2": 3, "C-9": 0}


class ShopEnv:
    def __init__(self):
        self.stock: dict[str, int] = {}
        self.reserved: dict[str, int] = {}

    def reset(self, **kwargs) -> str | None:
        self.stock = dict(STOCK)
        self.reserved = {}
        return None

    def check_stock(self, sku: str) -> str:
        """
        Look up how many units of an item are in stock.

        Args:
            sku: The item's code, such as 'A-17'

        Returns:
            The units in stock.
        """
        if sku not in self.stock:
            raise ValueError(f"Unknown item {sku}.")
        return f"{self.stock[sku]} units of {sku} in stock"

    def reserve(self, sku: str, quantity: int) -> str:
        """
        Reserve units of an item for the customer.

        Args:
            sku: The item's code
            quantity: How many units to reserve

        Returns:
            A confirmation.
        """
        if sku not in self.stock:
            raise ValueError(f"Unknown item {sku}.")
        if quantity > self.stock[sku]:
            raise ValueError(f"Only {self.stock[sku]} units of {sku} in stock.")
        self.stock[sku] -= quantity
        self.reserved[sku] = self.reserved.get(sku, 0) + quantity
        return f"Reserved {quantity} units of {sku}."


def reserved_reward(environments, sku, quantity, **kwargs) -> list[float]:
    """1.0 when exactly the requested units were reserved, else 0.0 (columns arrive as lists)."""
    return [
        1.0 if env.reserved == {s: q} else 0.0
        for env, s, q in zip(environments, sku, quantity, strict=True)
    ]
