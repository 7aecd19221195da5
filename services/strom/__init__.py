"""strom: a distributed, partitioned, replicated commit log.

The package is split by role (see DESIGN §10): ``strom.record`` and ``strom.log`` are pure
engines; ``strom.storage``, ``strom.controller`` and ``strom.coordinator`` wire them to gRPC and
etcd; ``strom.client`` is what applications import.
"""

__version__ = "0.1.0"
