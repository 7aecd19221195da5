"""The etcd wrapper against a real etcd: CAS, leases, watches across an etcd restart,
elections."""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Callable

import pytest

from strom.api import metadata_pb2 as md
from strom.devcluster.procs import EtcdServer, free_port, wait_for
from strom.metadata import (
    Election,
    LeaseLostError,
    MetadataStore,
    MetadataUnavailableError,
    parse_endpoints,
)

pytestmark = pytest.mark.integration


def _state(leader: int, epoch: int) -> md.PartitionState:
    return md.PartitionState(replicas=[1, 2], leader=leader, leader_epoch=epoch, isr=[1, 2])


def test_parse_endpoints_names_the_bad_one() -> None:
    assert parse_endpoints("a:1, b:2") == [("a", 1), ("b", 2)]
    with pytest.raises(ValueError, match="nohost"):
        parse_endpoints("nohost")
    with pytest.raises(ValueError, match="no etcd endpoint"):
        parse_endpoints("")


def test_cas_fences_stale_writers(etcd: EtcdServer) -> None:
    store = MetadataStore(etcd.endpoint, "c1")
    key = store.keys.partition("t", 0)
    assert store.cas(key, _state(1, 0), 0)  # create when absent
    assert not store.cas(key, _state(1, 0), 0)  # already exists
    first = store.get(key, md.PartitionState)
    assert first is not None and first.value.leader == 1
    assert store.cas(key, _state(2, 1), first.mod_revision)
    # A writer that read the old revision is refused and changes nothing.
    assert not store.cas(key, _state(3, 2), first.mod_revision)
    now = store.get(key, md.PartitionState)
    assert now is not None and now.value.leader == 2 and now.value.leader_epoch == 1
    rev, items = store.get_prefix(store.keys.partitions_prefix, md.PartitionState)
    assert rev >= now.mod_revision and list(items) == [key]
    assert store.keys.parse_partition(key) == ("t", 0)


def test_lease_bound_key_disappears_when_keepalive_stops(etcd: EtcdServer) -> None:
    store = MetadataStore(etcd.endpoint, "c1")
    lease = store.grant_lease(2)
    key = store.keys.node(7)
    store.put(key, md.NodeRegistration(node_id=7, host="h", port=1), lease=lease)
    ka = store.keep_alive(lease, lambda: None)
    # Kept alive well past the TTL: still there.
    wait_for(
        lambda: ka._thread.is_alive() and store.get(key, md.NodeRegistration),
        timeout=5,
        what="registration",
    )
    ka.stop(revoke=True)
    wait_for(
        lambda: store.get(key, md.NodeRegistration) is None,
        timeout=5,
        what="key removed with its lease",
    )


def test_watch_resumes_after_etcd_restart_without_losing_events(etcd: EtcdServer) -> None:
    store = MetadataStore(etcd.endpoint, "c1")
    prefix = store.keys.topics_prefix
    seen: list[str] = []
    lock = threading.Lock()

    def on_events(events: list, revision: int) -> None:
        with lock:
            seen.extend(e.key for e in events)

    watch = store.watch_prefix(prefix, store.revision() + 1, on_events)
    store.put(prefix + "a", md.TopicMetadata(name="a"))
    wait_for(lambda: prefix + "a" in seen, timeout=5, what="first event")

    etcd.kill()
    with pytest.raises(MetadataUnavailableError):
        store.put(prefix + "never", md.TopicMetadata(name="never"))
    etcd.start()
    store.retry(lambda: store.put(prefix + "b", md.TopicMetadata(name="b")), deadline_s=20)
    store.put(prefix + "c", md.TopicMetadata(name="c"))
    wait_for(lambda: prefix + "c" in seen, timeout=15, what="events after restart")
    watch.cancel()
    with lock:
        assert seen == [prefix + "a", prefix + "b", prefix + "c"]  # in order, none twice


def test_election_moves_to_standby_when_leader_resigns_or_dies(etcd: EtcdServer) -> None:
    stores = [MetadataStore(etcd.endpoint, "c1") for _ in range(2)]
    elected: list[int] = []
    elections = []
    for i, store in enumerate(stores):
        e = Election(
            store,
            store.keys.controller,
            md.ControllerInfo(controller_id=i),
            ttl_s=2,
            on_elected=lambda rev, i=i: elected.append(i),
            on_lost=lambda: None,
        )
        e.start()
        elections.append(e)
    wait_for(lambda: len(elected) == 1, timeout=10, what="a first leader")
    first = elected[0]
    info = stores[0].get(stores[0].keys.controller, md.ControllerInfo)
    assert info is not None and info.value.controller_id == first
    elections[first].resign()
    wait_for(lambda: len(elected) == 2, timeout=10, what="the standby to take over")
    assert elected[1] == 1 - first
    for e in elections:
        e.resign()


def _candidate(store: MetadataStore, cid: int, on_elected: Callable[[int], None]) -> Election:
    return Election(
        store,
        store.keys.controller,
        md.ControllerInfo(controller_id=cid),
        ttl_s=2,
        on_elected=on_elected,
        on_lost=lambda: None,
    )


def test_a_resign_during_a_campaign_leaves_no_key_behind(etcd: EtcdServer) -> None:
    """resign() while the candidate is creating the key (its lease had just expired, say):
    the key must not outlive the resignation, or no candidate could ever win again (a
    controller that lost its lease while paused stayed inactive for good)."""
    store = MetadataStore(etcd.endpoint, "c-resign")
    elected: list[int] = []
    election = _candidate(store, 1, elected.append)
    create = store.create
    resigner = threading.Thread(target=election.resign)

    def create_while_resigning(*args: object, **kwargs: object) -> bool:
        # resign() starts now; give it the chance to finish before the key is created
        # (it cannot while a campaign is under way: then it waits for the campaign).
        resigner.start()
        resigner.join(timeout=0.5)
        return create(*args, **kwargs)  # type: ignore[arg-type]

    store.create = create_while_resigning  # type: ignore[method-assign]
    try:
        election.start()
        wait_for(lambda: resigner.ident is not None, timeout=10, what="a campaign")
        resigner.join(timeout=10)
        assert not resigner.is_alive()
        assert not election.leader
        assert store.get(store.keys.controller, md.ControllerInfo) is None
        # And the next candidate wins.
        store.create = create  # type: ignore[method-assign]
        won: list[int] = []
        successor = _candidate(store, 2, won.append)
        successor.start()
        wait_for(lambda: bool(won), timeout=10, what="the next candidate elected")
        info = store.get(store.keys.controller, md.ControllerInfo)
        assert info is not None and info.value.controller_id == 2
        successor.resign()
    finally:
        store.create = create  # type: ignore[method-assign]
        store.close()


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    from strom.service import metrics as service_metrics

    return REGISTRY.get_sample_value(name, {"service": service_metrics.SERVICE, **labels}) or 0.0


def _lost() -> float:
    return _sample("strom_metadata_leases_lost_total")


def test_a_write_on_an_expired_lease_is_a_lost_lease_not_an_etcd_error(etcd: EtcdServer) -> None:
    """Found from outside: a coordinator's writes on its expired lease (NOT_FOUND "requested
    lease not found") were counted as etcd errors (feeding StromEtcdErrors) and logged as
    the gRPC error's multi-line dump."""
    store = MetadataStore(etcd.endpoint, "c-lease-gone")
    lease = store.grant_lease(30)
    store.client.revoke_lease(lease.id)  # gone, as after an expiry
    errors = _sample("strom_metadata_etcd_errors_total", op="put") + _sample(
        "strom_metadata_etcd_errors_total", op="txn"
    )
    lost = _lost()
    key = store.keys.node(9)
    value = md.NodeRegistration(node_id=9, host="h", port=1)
    with pytest.raises(LeaseLostError) as put_error:
        store.put(key, value, lease=lease)
    assert str(put_error.value) == (
        "etcd lease expired: NOT_FOUND: etcdserver: requested lease not found"
    )
    with pytest.raises(LeaseLostError):
        store.create(key, value, lease=lease)
    assert _lost() == lost + 1  # one lease, counted once
    assert (
        _sample("strom_metadata_etcd_errors_total", op="put")
        + _sample("strom_metadata_etcd_errors_total", op="txn")
        == errors
    )
    assert store.get(key, md.NodeRegistration) is None
    store.close()


def test_an_election_lease_lost_before_its_keeper_saw_it_is_counted(etcd: EtcdServer) -> None:
    """Found from outside: an active controller sees its election key vanish (the lease
    expired) before the lease keeper does, and resigns, which stops the keeper: the loss
    was never counted in strom_metadata_leases_lost_total."""
    store = MetadataStore(etcd.endpoint, "c-election-lost")
    elected: list[int] = []
    election = Election(
        store,
        store.keys.controller,
        md.ControllerInfo(controller_id=1),
        ttl_s=30,  # the keeper refreshes every 10 s: it does not see the loss first
        on_elected=elected.append,
        on_lost=lambda: None,
    )
    election.start()
    wait_for(lambda: elected, timeout=10, what="the candidate to win")
    current = store.client.get(store.keys.controller)[1]
    lost = _lost()
    store.client.revoke_lease(current.lease_id)  # the lease ends as an expiry would
    wait_for(
        lambda: store.get(store.keys.controller, md.ControllerInfo) is None,
        timeout=10,
        what="the election key to vanish",
    )
    election.resign()  # what the controller does when its key vanished
    assert _lost() == lost + 1
    store.close()


def test_a_keeper_that_cannot_reach_etcd_knows_when_its_lease_has_surely_expired() -> None:
    """What a coordinator cut off from etcd (or back from a pause) uses to stop counting the
    shards on that lease as its own before it can hear that the lease is gone."""
    from types import SimpleNamespace

    store = MetadataStore(f"127.0.0.1:{free_port()}", "c-cut-off")  # nothing listens there
    keeper = store.keep_alive(SimpleNamespace(id=1, ttl=1), lambda: None)
    try:
        assert not keeper.surely_expired()  # just granted
        assert not keeper.may_have_expired()
        wait_for(keeper.surely_expired, timeout=10, what="the TTL to pass without a refresh")
        # What the active controller goes by (it turns no later than surely_expired).
        assert keeper.may_have_expired()
        assert not keeper.lost  # etcd never said so: it cannot be reached
    finally:
        keeper.stop(revoke=False)
        store.close()


def test_a_new_leases_ttl_counts_from_when_its_grant_was_sent(etcd: EtcdServer) -> None:
    """etcd starts a lease's TTL when it handles the grant: ``may_have_expired`` counts from
    the grant's sending, not from when the keeper was made (a round trip later)."""
    store = MetadataStore(etcd.endpoint, "c-grant-sent")
    before = time.monotonic()
    lease = store.grant_lease(10)
    answered = time.monotonic()
    keeper = store.keep_alive(lease, lambda: None)
    try:
        assert before <= keeper.renewed_from <= answered
        assert not keeper.may_have_expired()
    finally:
        keeper.stop()
        store.close()


def test_a_lease_that_surely_expired_is_counted_lost_before_etcd_can_say_so() -> None:
    """Found from outside: a leader cut off from etcd for 30-60 s moved
    strom_metadata_leases_lost_total only at the heal, when etcd could answer that the lease
    was gone; the loss (its keys gone, its leaderships moved) came a TTL after the last
    refresh. Counted then, once."""
    from types import SimpleNamespace

    store = MetadataStore(f"127.0.0.1:{free_port()}", "c-cut-off-counted")  # nothing listens
    lost = _lost()
    keeper = store.keep_alive(SimpleNamespace(id=0x5EC1, ttl=1), lambda: None)
    try:
        wait_for(lambda: _lost() > lost, timeout=10, what="the surely expired lease counted")
        assert keeper.surely_expired() and not keeper.lost
        assert _lost() == lost + 1
        wait_for(lambda: keeper.failures >= 8, timeout=10, what="more failed refreshes")
        assert _lost() == lost + 1  # once
    finally:
        keeper.stop(revoke=False)
        store.close()


def test_an_etcd_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd paused (SIGSTOP) for a while: one WARNING naming its endpoint when the lease
    keep-alives stop getting answers (not one per failed refresh, four a second), and one
    INFO with the outage's length when it answers again. Before, only a metric counted the
    failures and no service logged anything."""
    caplog.set_level(logging.INFO, logger="strom.metadata")
    store = MetadataStore(etcd.endpoint, "c-outage")
    lease = store.grant_lease(10)
    keeper = store.keep_alive(lease, lambda: None)
    assert etcd.process is not None
    try:
        wait_for(lambda: keeper.refreshes > 0, timeout=20, what="a first refresh")
        etcd.process.signal(signal.SIGSTOP)
        try:
            wait_for(lambda: keeper.failures >= 6, timeout=30, what="refreshes to fail")
        finally:
            etcd.process.signal(signal.SIGCONT)
        wait_for(
            lambda: any("answers again" in r.getMessage() for r in caplog.records),
            timeout=30,
            what="the end of the outage logged",
        )
    finally:
        keeper.stop(revoke=False)
        store.close()
    ours = [r for r in caplog.records if r.name == "strom.metadata"]
    down = [r for r in ours if "does not answer" in r.getMessage()]
    assert len(down) == 1, [r.getMessage() for r in ours]
    assert down[0].levelno == logging.WARNING
    assert etcd.endpoint in down[0].getMessage()
    assert "keep-alive of lease" in down[0].getMessage()
    back = [r for r in ours if "answers again" in r.getMessage()]
    assert len(back) == 1 and back[0].levelno == logging.INFO
    assert re.search(r"after \d+\.\ds without an answer", back[0].getMessage())
