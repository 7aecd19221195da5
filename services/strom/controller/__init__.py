"""The controller (DESIGN §2, §3, §6): one active instance chosen by an etcd election creates,
grows and deletes topics and answers admin RPCs; standbys point callers at the active one.

``placement`` and ``validation`` are pure engines (no gRPC, no etcd) so they are tested fast
and alone; ``service`` wires them to gRPC and etcd; ``cli`` is ``strom controller``.
"""
