"""The built-in zoo: models built in code with seeded weights, per framework (never downloaded)."""

from mlc.models.zoo import ZOO, ZOO_PREFIX, ZooModel, get, is_zoo

__all__ = ["ZOO", "ZOO_PREFIX", "ZooModel", "get", "is_zoo"]
