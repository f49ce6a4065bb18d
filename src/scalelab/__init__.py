"""scalelab: find where an ML system stops scaling, and why."""

__version__ = "0.1.0"
