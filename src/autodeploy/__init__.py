"""autodeploy: find the fastest engine, precision, batch and threads for a model on each device, then ship it.

Importing this package imports no inference engine; engines load lazily inside adapters.
"""

__version__ = "0.1.0"
