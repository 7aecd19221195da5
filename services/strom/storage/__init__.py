"""The storage node (DESIGN §2): hosts partition replicas and serves the data plane.

``cli`` parses flags, ``node`` wires registration, the partition manager, the servicer and
the background tasks together; ``assignment`` and ``longpoll`` are the pure pieces.
"""
