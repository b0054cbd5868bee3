"""driftfl: federated learning on non-IID data, built on Flower."""

__version__ = "0.1.0"
