"""tcdsl: a compiler for Linux traffic-control policy."""

__version__ = "0.1.0"
