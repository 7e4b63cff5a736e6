"""pgdecode: PostgreSQL's logical-decoding output-plugin framework, driven by pgoutput.

Layers, imports pointing one way:

- ``plugin_framework.protocol``: the pgoutput codec (bytes in, typed messages out, and back).
- ``plugin_framework.framework``: output plugins, contexts, transactions, the dispatcher.
- ``plugin_framework.sources``: the only code that talks to a server.
"""

from __future__ import annotations

__version__ = "0.1.0"
