"""The Admin client is split by area (strom.client.admin_topics, admin_configs, admin_cluster,
admin_records, admin_transactions, admin_reassignments, admin_groups, on admin_calls); what
users see must not follow the split: ``strom.client.admin.Admin`` with the same methods, the
names imported from ``strom.client.admin``, and the attributes the areas say they take from
``Admin.__init__``."""

from __future__ import annotations

import inspect

from strom.client import admin
from strom.client.admin import Admin
from strom.client.admin_calls import AdminCalls

#: Admin's public methods as they were before the split: a mixin dropped from the bases, or a
#: method that went to a module no mixin brings in, would be missing here.
METHODS = {
    "abort_transaction", "alter_configs", "alter_group_offsets", "alter_node_configs",
    "alter_partition_reassignments", "close", "create_partitions", "create_topic",
    "create_topics", "delete_group_offsets", "delete_groups", "delete_records", "delete_topic",
    "delete_topics", "describe_cluster", "describe_configs", "describe_groups",
    "describe_node_configs", "describe_producers", "describe_topic", "describe_topics",
    "elect_leaders", "fence_producers", "list_group_offsets", "list_groups", "list_offsets",
    "list_partition_reassignments", "list_topics",
}  # fmt: skip


def test_admin_has_the_same_public_methods_each_documented() -> None:
    assert {n for n in dir(Admin) if not n.startswith("_")} == METHODS
    for name in METHODS:
        assert inspect.getdoc(getattr(Admin, name)), name
    assert all(issubclass(m, AdminCalls) for m in Admin.__mro__[1:-2])


def test_the_names_still_import_from_the_admin_module() -> None:
    for name in admin.__all__:
        assert getattr(admin, name) is not None
    for name in (
        "DEFAULT_API_TIMEOUT_MS",
        "DEFAULT_REQUEST_TIMEOUT_MS",
        "FENCE_TRANSACTION_TIMEOUT_MS",
        "ProducerState",  # strom transactions imports it from here
        "ConfigValue",
        "Assignment",
        "TopicPartition",
        "OffsetAndTimestamp",
    ):
        assert getattr(admin, name) is not None


def test_every_attribute_the_areas_declare_is_one_an_admin_has() -> None:
    """AdminCalls' annotations are the areas' contract with ``Admin.__init__``: a name
    declared there but no longer set (renamed, dropped) would fail only on the call that
    reads it."""
    with Admin("127.0.0.1:1") as a:  # connects lazily: nothing is sent
        missing = [n for n in AdminCalls.__annotations__ if not hasattr(a, n)]
        assert not missing, f"AdminCalls declares {missing}, which an Admin lacks"
