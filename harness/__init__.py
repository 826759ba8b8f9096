"""harness: decentralized and wait-avoiding distributed SGD under stragglers and slow links.

Entry point: ``python -m harness --help``.
"""

__version__ = "0.1.0"
